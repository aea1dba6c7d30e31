//! Probe filter for host-sim's tests. Paths:
//! * `/park-queue`: pause; ask this VM's inbox to resume the stream (`release`).
//! * `/park-reply`: pause; ask this VM's inbox to answer it with a local 429 (`reply`).
//! * `/park`: pause until a tick or a `/release-all` on the same VM.
//! * `/release-all`: release every stream parked on this VM, in one callback.
//! * `/global`: enqueue on the queue every VM registered under the same name.
//! Every VM appends its uid to `probe.vms` (registration order) in `on_configure`.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, Status};
use std::cell::{Cell, RefCell};

thread_local! {
    static UID: Cell<u64> = const { Cell::new(0) };
    static PARKED: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    static INBOX: Cell<u32> = const { Cell::new(0) };
}

fn append(key: &str, item: &str) {
    for _ in 0..100 {
        let (v, cas) = hostcalls::get_shared_data(key).unwrap_or((None, None));
        let mut s = v
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        if !s.is_empty() {
            s.push(',');
        }
        s.push_str(item);
        if hostcalls::set_shared_data(key, Some(s.as_bytes()), cas).is_ok() {
            return;
        }
    }
}

fn next_uid() -> u64 {
    for _ in 0..100 {
        let (v, cas) = hostcalls::get_shared_data("probe.seq").unwrap_or((None, None));
        let n = v
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0)
            + 1;
        if hostcalls::set_shared_data("probe.seq", Some(n.to_string().as_bytes()), cas).is_ok() {
            return n;
        }
    }
    0
}

fn send_self(msg: &str) {
    let uid = UID.with(Cell::get);
    if let Ok(Some(q)) = hostcalls::resolve_shared_queue("probe", &format!("inbox-{uid}")) {
        let _ = hostcalls::enqueue_shared_queue(q, Some(msg.as_bytes()));
    }
}

fn release(ctx: u32, how: &str) {
    match hostcalls::set_effective_context(ctx) {
        Ok(()) => {
            let uid = UID.with(Cell::get).to_string();
            if how == "reply" {
                let _ = hostcalls::send_http_response(
                    429,
                    vec![("x-released-by", &uid)],
                    Some(b"later"),
                );
            } else {
                let _ = hostcalls::set_map_value(
                    proxy_wasm::types::MapType::HttpRequestHeaders,
                    "x-released-by",
                    Some(&uid),
                );
                let _ = hostcalls::resume_http_request();
            }
        }
        Err(Status::BadArgument) => append("probe.gone", &ctx.to_string()),
        Err(_) => append("probe.error", &ctx.to_string()),
    }
}

struct Root {
    id: u32,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _: usize) -> bool {
        let uid = next_uid();
        UID.with(|c| c.set(uid));
        if let Ok(q) = hostcalls::register_shared_queue(&format!("inbox-{uid}")) {
            INBOX.with(|c| c.set(q));
        }
        let _ = hostcalls::register_shared_queue("global");
        append("probe.vms", &uid.to_string());
        let _ = hostcalls::set_tick_period(std::time::Duration::from_millis(1000));
        true
    }

    fn on_queue_ready(&mut self, token: u32) {
        while let Ok(Some(msg)) = hostcalls::dequeue_shared_queue(token) {
            let msg = String::from_utf8_lossy(&msg).into_owned();
            let uid = UID.with(Cell::get);
            if msg == "hello" {
                append("probe.global_receivers", &uid.to_string());
                continue;
            }
            let mut parts = msg.split(' ');
            let (how, ctx) = (parts.next().unwrap_or(""), parts.next().unwrap_or("0"));
            if how == "reply-all" {
                let all: Vec<u32> = PARKED.with(|p| p.borrow_mut().drain(..).collect());
                for c in all {
                    release(c, "reply");
                }
            } else if how == "release-all" {
                let all: Vec<u32> = PARKED.with(|p| p.borrow_mut().drain(..).collect());
                for c in all {
                    release(c, "release");
                }
            } else {
                release(ctx.parse().unwrap_or(0), how);
            }
        }
        let _ = hostcalls::set_effective_context(self.id);
    }

    fn on_tick(&mut self) {
        let all: Vec<u32> = PARKED.with(|p| p.borrow_mut().drain(..).collect());
        for c in all {
            release(c, "release");
        }
        let _ = hostcalls::set_effective_context(self.id);
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Http { id: context_id }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Http {
    id: u32,
}

impl Http {
    fn callout(
        &self,
        cluster: &str,
        header: &str,
        to: &str,
        method: &str,
        path: &str,
        timeout_ms: u64,
    ) -> Action {
        let body = br#"{"model":"m","prompt":"p","max_tokens":1}"#;
        let headers = vec![
            (":method", method),
            (":path", path),
            (":authority", to),
            (header, to),
        ];
        let body = if method == "POST" {
            Some(&body[..])
        } else {
            None
        };
        match self.dispatch_http_call(
            cluster,
            headers,
            body,
            vec![],
            std::time::Duration::from_millis(timeout_ms),
        ) {
            Ok(_) => Action::Pause,
            Err(e) => {
                self.send_http_response(500, vec![("x-dispatch-error", &format!("{e:?}"))], None);
                Action::Pause
            }
        }
    }
}

impl Context for Http {
    fn on_http_call_response(
        &mut self,
        _token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let status = self
            .get_http_call_response_header(":status")
            .unwrap_or_default();
        let body = self
            .get_http_call_response_body(0, body_size)
            .unwrap_or_default();
        self.send_http_response(200, vec![("x-callout-status", &status)], Some(&body));
    }

    fn on_done(&mut self) -> bool {
        PARKED.with(|p| p.borrow_mut().retain(|c| *c != self.id));
        append("probe.events", &format!("done {}", self.id));
        true
    }
}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let path = self.get_http_request_header(":path").unwrap_or_default();
        let uid = UID.with(Cell::get).to_string();
        self.set_http_request_header("x-gateway-destination-endpoint", Some("10.0.0.1:8000"));
        self.set_http_request_header("x-probe-vm", Some(&uid));
        match path.as_str() {
            "/body" => Action::Pause,
            "/park-queue" => {
                send_self(&format!("release {}", self.id));
                Action::Pause
            }
            "/park-reply" => {
                send_self(&format!("reply {}", self.id));
                Action::Pause
            }
            "/park" => {
                PARKED.with(|p| p.borrow_mut().push(self.id));
                Action::Pause
            }
            "/reply-all" => {
                send_self("reply-all 0");
                Action::Continue
            }
            "/release-all" => {
                send_self("release-all 0");
                Action::Continue
            }
            "/callout-metrics" => self.callout(
                "scrape",
                "x-envoy-original-dst-host",
                "10.0.0.1:8000",
                "GET",
                "/metrics",
                1000,
            ),
            "/callout-slow" => self.callout(
                "pool",
                "x-gateway-destination-endpoint",
                "10.0.0.2:8000",
                "POST",
                "/v1/completions",
                100,
            ),
            "/callout-dead" => self.callout(
                "scrape",
                "x-envoy-original-dst-host",
                "10.0.0.9:8000",
                "GET",
                "/metrics",
                1000,
            ),
            "/global" => {
                if let Ok(Some(q)) = hostcalls::resolve_shared_queue("probe", "global") {
                    let _ = hostcalls::enqueue_shared_queue(q, Some(b"hello"));
                }
                Action::Continue
            }
            _ => Action::Continue,
        }
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        let seen = self.get_http_request_body(0, size).map_or(0, |b| b.len());
        append("probe.bodies", &format!("{size}/{seen}/{end_of_stream}"));
        if end_of_stream {
            Action::Continue
        } else {
            Action::Pause
        }
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        self.set_http_response_header("x-probe-seen", Some("1"));
        Action::Continue
    }

    fn on_log(&mut self) {
        append("probe.events", &format!("log {}", self.id));
    }
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|id| Box::new(Root { id }));
}}
