//! Probe: does `tokenizers` build for wasm32-wasip1, and what does it cost?
use std::cell::RefCell;
use tokenizers::Tokenizer;

thread_local! {
    static TOK: RefCell<Option<Tokenizer>> = const { RefCell::new(None) };
}

#[no_mangle]
pub extern "C" fn alloc(n: usize) -> *mut u8 {
    let mut v = Vec::<u8>::with_capacity(n);
    let p = v.as_mut_ptr();
    std::mem::forget(v);
    p
}

/// Loads tokenizer.json bytes; returns 0 on success.
#[no_mangle]
pub extern "C" fn load(ptr: *const u8, len: usize) -> i32 {
    let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
    match Tokenizer::from_bytes(bytes) {
        Ok(t) => {
            TOK.with(|c| *c.borrow_mut() = Some(t));
            0
        }
        Err(_) => 1,
    }
}

/// Encodes UTF-8 text; returns the number of tokens (or -1).
#[no_mangle]
pub extern "C" fn encode(ptr: *const u8, len: usize) -> i32 {
    let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
    let Ok(text) = std::str::from_utf8(bytes) else { return -1 };
    TOK.with(|c| match c.borrow().as_ref() {
        Some(t) => t.encode(text, false).map(|e| e.get_ids().len() as i32).unwrap_or(-1),
        None => -1,
    })
}
