//! A small blocking HTTP/1.1 client (one request per connection) that records when
//! each piece of the body arrived, so tests can see streaming as a client does.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A complete response.
#[derive(Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers, names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    /// The decoded body.
    pub body: Vec<u8>,
    /// Each decoded body piece with the instant its bytes arrived.
    pub pieces: Vec<(Instant, Vec<u8>)>,
}

impl Response {
    /// First value of a header (name in lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }
}

/// `GET path`.
pub fn get(addr: &str, path: &str) -> io::Result<Response> {
    request(addr, "GET", path, &[], b"")
}

/// `POST path` with a JSON body.
pub fn post_json(addr: &str, path: &str, body: &str) -> io::Result<Response> {
    request(
        addr,
        "POST",
        path,
        &[("content-type", "application/json")],
        body.as_bytes(),
    )
}

/// Sends one request on a new connection and reads the whole response (30 s limit).
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<Response> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    Reader::new(s).response()
}

/// Reads from the socket, remembering when each read returned.
struct Reader {
    s: TcpStream,
    buf: Vec<u8>,
    at: Instant,
    eof: bool,
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

impl Reader {
    fn new(s: TcpStream) -> Self {
        Self {
            s,
            buf: Vec::new(),
            at: Instant::now(),
            eof: false,
        }
    }

    fn fill(&mut self) -> io::Result<()> {
        let mut tmp = [0u8; 16384];
        let n = self.s.read(&mut tmp)?;
        self.at = Instant::now();
        if n == 0 {
            self.eof = true;
        }
        self.buf.extend_from_slice(&tmp[..n]);
        Ok(())
    }

    fn line(&mut self) -> io::Result<String> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..i]).into_owned();
                self.buf.drain(..i + 2);
                return Ok(line);
            }
            if self.eof {
                return Err(bad("connection closed mid-line"));
            }
            self.fill()?;
        }
    }

    fn take(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() < n {
            if self.eof {
                return Err(bad("connection closed mid-body"));
            }
            self.fill()?;
        }
        Ok(self.buf.drain(..n).collect())
    }

    fn response(mut self) -> io::Result<Response> {
        let status_line = self.line()?;
        let status = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("bad status line"))?;
        let mut headers = Vec::new();
        loop {
            let line = self.line()?;
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let find = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let mut pieces = Vec::new();
        if find("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            loop {
                let size_line = self.line()?;
                let size =
                    usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                        .map_err(|_| bad("bad chunk size"))?;
                let data = self.take(size)?;
                self.line()?;
                if size == 0 {
                    break;
                }
                pieces.push((self.at, data));
            }
        } else if let Some(len) = find("content-length").and_then(|v| v.parse::<usize>().ok()) {
            let data = self.take(len)?;
            pieces.push((self.at, data));
        } else {
            while !self.eof {
                self.fill()?;
            }
            let data = std::mem::take(&mut self.buf);
            pieces.push((self.at, data));
        }
        let body = pieces.iter().flat_map(|(_, d)| d.iter().copied()).collect();
        Ok(Response {
            status,
            headers,
            body,
            pieces,
        })
    }
}
