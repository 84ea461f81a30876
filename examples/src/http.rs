//! A minimal HTTP/1.1 JSON client for the examples: one connection per request,
//! so every call really goes through the server it talks to.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;

/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A response: status code and JSON body (`Null` when empty, a string when not JSON).
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

/// The web binary at `addr`.
#[derive(Debug, Clone, Copy)]
pub struct Client {
    addr: SocketAddr,
}

impl Client {
    pub fn new(addr: SocketAddr) -> Self {
        Client { addr }
    }

    pub async fn get(&self, path: &str) -> Result<Reply, String> {
        self.request(Method::GET, path, None, None).await
    }

    /// POSTs `body` as JSON, with an `Idempotency-Key` header when `key` is given.
    pub async fn post_json(
        &self,
        path: &str,
        key: Option<&str>,
        body: &Value,
    ) -> Result<Reply, String> {
        self.request(Method::POST, path, key, Some(body)).await
    }

    async fn request(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Option<&Value>,
    ) -> Result<Reply, String> {
        let what = format!("{method} http://{}{path}", self.addr);
        let exchange = async {
            let stream = TcpStream::connect(self.addr)
                .await
                .map_err(|e| e.to_string())?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            let mut req = Request::builder()
                .method(method)
                .uri(path)
                .header(HOST, self.addr.to_string());
            if let Some(key) = key {
                req = req.header("idempotency-key", key);
            }
            let bytes = match body {
                Some(v) => {
                    req = req.header(CONTENT_TYPE, "application/json");
                    Bytes::from(v.to_string())
                }
                None => Bytes::new(),
            };
            let req = req.body(Full::new(bytes)).map_err(|e| e.to_string())?;
            let res = sender.send_request(req).await.map_err(|e| e.to_string())?;
            let status = res.status().as_u16();
            let bytes = res
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            let body = if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
            };
            Ok::<_, String>(Reply { status, body })
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => Err(format!("{what}: {e}")),
            Err(_) => Err(format!("{what}: no answer within {REQUEST_TIMEOUT:?}")),
        }
    }
}
