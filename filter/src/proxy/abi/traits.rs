//! What a context implements: the callbacks the filter handles, with the names and
//! signatures of the upstream `proxy-wasm` SDK's traits (a callback the filter does not
//! handle is not exported at all, see `exports`).

/// What a stream callback tells Envoy (ABI values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Action {
    /// Go on with the stream.
    Continue = 0,
    /// Stop iterating (headers) or buffer (body) until the filter resumes the stream.
    Pause = 1,
}

/// The kind of stream context a root context creates (only HTTP here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextType {
    /// One per HTTP request.
    HttpContext,
}

/// Callbacks shared by root and HTTP contexts.
pub trait Context {
    /// The response to an HTTP callout this context sent.
    fn on_http_call_response(
        &mut self,
        _token_id: u32,
        _num_headers: usize,
        _body_size: usize,
        _num_trailers: usize,
    ) {
    }

    /// The context ends: `true` when it is done, `false` when a root context still has
    /// work (it calls `host::done` when finished).
    fn on_done(&mut self) -> bool {
        true
    }
}

/// One per plugin per VM.
pub trait RootContext: Context {
    /// The plugin's configuration is ready (`size` bytes): `false` refuses it.
    fn on_configure(&mut self, _size: usize) -> bool {
        true
    }

    /// The period set with `host::set_tick_period_ms` elapsed.
    fn on_tick(&mut self) {}

    /// A message arrived in a shared queue this VM registered.
    fn on_queue_ready(&mut self, _queue_id: u32) {}

    /// A new HTTP request: its context, `None` to leave the request alone.
    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        None
    }

    /// What [`RootContext::create_http_context`] makes; `None`: no stream contexts.
    fn get_type(&self) -> Option<ContextType> {
        None
    }
}

/// One per HTTP request. Envoy ends it with `on_done` (after its access log, at the
/// end of the stream however it ended).
pub trait HttpContext: Context {
    /// The request headers (`end_of_stream` when there is no body).
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        Action::Continue
    }

    /// A request body chunk; `body_size` is all that is buffered so far.
    fn on_http_request_body(&mut self, _body_size: usize, _end_of_stream: bool) -> Action {
        Action::Continue
    }

    /// The response headers.
    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        Action::Continue
    }

    /// A response body chunk (`body_size` bytes of this chunk).
    fn on_http_response_body(&mut self, _body_size: usize, _end_of_stream: bool) -> Action {
        Action::Continue
    }
}

/// Makes the root context of a plugin (from its context id).
pub type NewRoot = fn(u32) -> Box<dyn RootContext>;
