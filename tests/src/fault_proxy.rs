//! A TCP proxy in front of a real server that can be told to misbehave, for the fault
//! tests: pass traffic through, hang (accept, read, never answer) or refuse (close at
//! once) — for every connection, or only for connections whose first request is a
//! `GET` of a given path (a model server's `/metrics` hangs while inference still
//! works). Changing the mode also cuts the connections already open, so a keep-alive
//! connection cannot outlive the fault. Stops when dropped.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// What the proxy does with a connection it applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Pass = 0,
    Hang = 1,
    Refuse = 2,
}

impl Mode {
    fn from_u8(v: u8) -> Mode {
        match v {
            1 => Mode::Hang,
            2 => Mode::Refuse,
            _ => Mode::Pass,
        }
    }
}

/// The proxy; its address is [`FaultProxy::address`].
pub struct FaultProxy {
    pub address: String,
    mode: Arc<AtomicU8>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
}

impl FaultProxy {
    /// A proxy to `target` (`host:port`). With `only_path`, the mode applies only to
    /// connections whose first request is `GET <only_path>`; the others always pass.
    pub fn start(target: &str, only_path: Option<&str>) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let address = listener.local_addr().expect("proxy address").to_string();
        let mode = Arc::new(AtomicU8::new(Mode::Pass as u8));
        let open = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (m, o, s) = (mode.clone(), open.clone(), stop.clone());
        let target = target.to_string();
        let only = only_path.map(|p| format!("GET {p}"));
        thread::spawn(move || {
            for client in listener.incoming() {
                if s.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(client) = client else { continue };
                let (m, o, target, only) = (m.clone(), o.clone(), target.clone(), only.clone());
                thread::spawn(move || serve(client, &target, only.as_deref(), &m, &o));
            }
        });
        FaultProxy {
            address,
            mode,
            open,
            stop,
        }
    }

    /// Switches the mode and cuts every connection open now.
    pub fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::Relaxed);
        if let Ok(mut open) = self.open.lock() {
            for c in open.drain(..) {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.set(Mode::Refuse);
        let _ = TcpStream::connect(&self.address); // wakes the accept loop
    }
}

fn serve(
    mut client: TcpStream,
    target: &str,
    only: Option<&str>,
    mode: &AtomicU8,
    open: &Mutex<Vec<TcpStream>>,
) {
    let mut first = vec![0u8; 64 * 1024];
    let n = match client.read(&mut first) {
        Ok(0) | Err(_) => return,
        Ok(n) => n,
    };
    first.truncate(n);
    let applies = only.is_none_or(|p| first.starts_with(p.as_bytes()));
    let m = if applies {
        Mode::from_u8(mode.load(Ordering::Relaxed))
    } else {
        Mode::Pass
    };
    match m {
        Mode::Refuse => {
            let _ = client.shutdown(Shutdown::Both);
        }
        Mode::Hang => {
            if let (Ok(c), Ok(mut list)) = (client.try_clone(), open.lock()) {
                list.push(c);
            }
            // Read and drop until the other side or `set` closes the connection.
            let mut sink = [0u8; 4096];
            while matches!(client.read(&mut sink), Ok(n) if n > 0) {}
        }
        Mode::Pass => {
            let Ok(mut upstream) = TcpStream::connect(target) else {
                let _ = client.shutdown(Shutdown::Both);
                return;
            };
            if upstream.write_all(&first).is_err() {
                return;
            }
            if applies {
                if let (Ok(c), Ok(u), Ok(mut list)) =
                    (client.try_clone(), upstream.try_clone(), open.lock())
                {
                    list.push(c);
                    list.push(u);
                }
            }
            let (Ok(mut c2), Ok(mut u2)) = (client.try_clone(), upstream.try_clone()) else {
                return;
            };
            let back = thread::spawn(move || {
                let _ = std::io::copy(&mut u2, &mut c2);
                let _ = c2.shutdown(Shutdown::Write);
            });
            let _ = client.set_read_timeout(Some(Duration::from_secs(600)));
            let _ = std::io::copy(&mut client, &mut upstream);
            let _ = upstream.shutdown(Shutdown::Write);
            let _ = back.join();
        }
    }
}
