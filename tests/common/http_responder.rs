//! A small HTTP/1.1 server for the webhook sink's tests: it records every request (headers
//! and body) and answers from a script, then with 200, or by a rule of the test's
//! ([`Responder::with_rule`]: a reply per request, e.g. a delay for one event). A reply may
//! also be no HTTP at all: bytes that do not parse ([`Reply::raw`]) or a connection reset
//! ([`Reply::reset`]).
//!
//! The sink's probes (`HEAD` requests) are kept apart: counted in [`Responder::probes`], not
//! in [`Responder::requests`], answered by the rule when it has a reply for them and with 200
//! otherwise, never from the script.
//!
//! It reads a request head up to the blank line, then exactly `Content-Length` body bytes,
//! and keeps the connection alive. It listens on 127.0.0.1 only and stops when the
//! [`Responder`] is dropped, or after five minutes in any case.
//!
//! `examples/relay_load_webhook.rs` uses it too, as the receiver it measures against.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

const LIFETIME: Duration = Duration::from_secs(300);
/// No test request is near this; a bigger body means a parsing bug.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// One request as received: header names in lower case.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }
}

/// One scripted answer.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// Held this long before answering.
    pub delay: Duration,
    /// The answer's body (sent with its `content-length`).
    pub body: Vec<u8>,
    /// Instead of an HTTP answer: these bytes as they are, then the connection closed.
    pub raw: Option<Vec<u8>>,
    /// Instead of an answer: the connection reset (RST), the request unanswered.
    pub reset: bool,
}

impl Reply {
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            delay: Duration::ZERO,
            body: Vec::new(),
            raw: None,
            reset: false,
        }
    }

    /// Bytes that are no HTTP answer, then the connection closed.
    pub fn raw(bytes: impl Into<Vec<u8>>) -> Reply {
        Reply {
            raw: Some(bytes.into()),
            ..Reply::status(0)
        }
    }

    /// The connection reset once the request was read.
    pub fn reset() -> Reply {
        Reply {
            reset: true,
            ..Reply::status(0)
        }
    }

    pub fn with_body(mut self, body: impl Into<Vec<u8>>) -> Reply {
        self.body = body.into();
        self
    }

    pub fn with_header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

/// A test's answer to a request, or `None` for the script's.
pub type Rule = Arc<dyn Fn(&Request) -> Option<Reply> + Send + Sync>;

#[derive(Default)]
struct Shared {
    rule: Mutex<Option<Rule>>,
    requests: Mutex<Vec<Request>>,
    probes: Mutex<Vec<Request>>,
    script: Mutex<VecDeque<Reply>>,
    watchers: Mutex<Vec<mpsc::UnboundedSender<Request>>>,
}

pub struct Responder {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: JoinHandle<()>,
}

impl Responder {
    /// A server that answers each request by `rule`, or when it says `None`, with 200.
    pub async fn with_rule(
        rule: impl Fn(&Request) -> Option<Reply> + Send + Sync + 'static,
    ) -> Responder {
        let responder = Responder::start(Vec::new()).await;
        *responder.shared.rule.lock().expect("rule lock") = Some(Arc::new(rule));
        responder
    }

    /// How many requests carried each `Ordo-Event-Id`.
    pub fn sends_per_event(&self) -> HashMap<String, usize> {
        let mut sends = HashMap::new();
        for request in self.requests() {
            if let Some(id) = request.header("Ordo-Event-Id") {
                *sends.entry(id.to_owned()).or_insert(0) += 1;
            }
        }
        sends
    }

    /// A server that answers `script` in order, then 200 to everything.
    pub async fn start(script: Vec<Reply>) -> Responder {
        Responder::at(0, script).await
    }

    /// [`Responder::start`] on 127.0.0.1:`port` (0: any free port), e.g. where a sink under
    /// test found nothing listening until now.
    pub async fn at(port: u16, script: Vec<Reply>) -> Responder {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind the HTTP responder");
        let addr = listener.local_addr().expect("the responder's address");
        let shared = Arc::new(Shared::default());
        shared.script.lock().expect("script lock").extend(script);
        let serving = Arc::clone(&shared);
        let acceptor = tokio::spawn(async move {
            let _ = tokio::time::timeout(LIFETIME, accept(listener, serving)).await;
        });
        Responder {
            addr,
            shared,
            acceptor,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.requests.lock().expect("requests lock").clone()
    }

    /// The sink's probes (`HEAD` requests) received so far.
    pub fn probes(&self) -> usize {
        self.shared.probes.lock().expect("probes lock").len()
    }

    /// How many requests were received so far.
    pub fn count(&self) -> usize {
        self.shared.requests.lock().expect("requests lock").len()
    }

    /// Every request received from now on, as it arrives (before it is answered).
    pub fn watch(&self) -> mpsc::UnboundedReceiver<Request> {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.shared
            .watchers
            .lock()
            .expect("watchers lock")
            .push(sender);
        receiver
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        connections.spawn(serve(stream, Arc::clone(&shared)));
        while connections.try_join_next().is_some() {}
    }
}

async fn serve(stream: TcpStream, shared: Arc<Shared>) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    while let Some(request) = read_request(&mut read).await {
        let rule = shared.rule.lock().expect("rule lock").clone();
        let ruled = rule.and_then(|rule| rule(&request));
        let reply = if request.method == "HEAD" {
            shared.probes.lock().expect("probes lock").push(request);
            ruled.unwrap_or_else(|| Reply::status(200))
        } else {
            shared
                .watchers
                .lock()
                .expect("watchers lock")
                .retain(|watcher| watcher.send(request.clone()).is_ok());
            shared.requests.lock().expect("requests lock").push(request);
            ruled.unwrap_or_else(|| {
                shared
                    .script
                    .lock()
                    .expect("script lock")
                    .pop_front()
                    .unwrap_or_else(|| Reply::status(200))
            })
        };
        tokio::time::sleep(reply.delay).await;
        if reply.reset {
            if let Ok(stream) = read.into_inner().reunite(write) {
                let _ = stream.set_zero_linger();
            }
            return;
        }
        if let Some(raw) = &reply.raw {
            let _ = write.write_all(raw).await;
            return;
        }
        let mut head = format!(
            "HTTP/1.1 {} Scripted\r\ncontent-length: {}\r\n",
            reply.status,
            reply.body.len()
        );
        for (name, value) in &reply.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        if write.write_all(head.as_bytes()).await.is_err()
            || write.write_all(&reply.body).await.is_err()
        {
            return;
        }
    }
}

async fn read_request<R: AsyncBufReadExt + Unpin>(read: &mut R) -> Option<Request> {
    let mut line = String::new();
    read.read_line(&mut line).await.ok().filter(|n| *n > 0)?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let path = parts.next()?.to_owned();
    let mut headers = HashMap::new();
    loop {
        let mut line = String::new();
        read.read_line(&mut line).await.ok().filter(|n| *n > 0)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
    }
    let length: usize = headers
        .get("content-length")
        .and_then(|value| value.parse().ok())
        .unwrap_or(0);
    if length > MAX_BODY {
        return None;
    }
    let mut body = vec![0; length];
    read.read_exact(&mut body).await.ok()?;
    Some(Request {
        method,
        path,
        headers,
        body,
    })
}
