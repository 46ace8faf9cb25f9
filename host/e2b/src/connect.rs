//! The Connect protocol (connectrpc.com/docs/protocol) over axum, in the two codecs envd
//! clients use: ProtoJSON (`application/json`, streams `application/connect+json`; the e2b SDKs)
//! and binary protobuf (`application/proto`, `application/connect+proto`).
//!
//! Unary calls carry one message as the body. Streams carry envelopes
//! (`flags u8 | length u32 BE | message`); the server's last envelope has flag 0x02 and a JSON
//! end-of-stream message (`{}` or `{"error": {...}}`). Every read has a byte cap; a stream's
//! request messages are read as they arrive, never all at once.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Largest request message accepted (envd's requests are small; file data goes through
/// `/files`, stdin through many small messages).
pub const MAX_MESSAGE: usize = 4 << 20;
/// How long a unary or server-streaming request's one message may take to arrive.
pub const MESSAGE_READ_TIMEOUT: Duration = Duration::from_secs(30);
const FLAG_COMPRESSED: u8 = 0x01;
const FLAG_END: u8 = 0x02;

/// A message both codecs can carry.
pub trait Message: prost::Message + Serialize + DeserializeOwned + Default + 'static {}
impl<T: prost::Message + Serialize + DeserializeOwned + Default + 'static> Message for T {}

/// The request's codec, from its content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Json,
    Proto,
}

impl Codec {
    /// The codec of a unary request (`application/json`, `application/proto`).
    pub fn unary(headers: &HeaderMap) -> Result<Codec, ConnectError> {
        match content_type(headers).as_str() {
            "application/json" | "" => Ok(Codec::Json),
            "application/proto" => Ok(Codec::Proto),
            other => Err(ConnectError::unsupported(other)),
        }
    }

    /// The codec of a streaming request (`application/connect+json`, `…+proto`).
    pub fn streaming(headers: &HeaderMap) -> Result<Codec, ConnectError> {
        match content_type(headers).as_str() {
            "application/connect+json" => Ok(Codec::Json),
            "application/connect+proto" => Ok(Codec::Proto),
            other => Err(ConnectError::unsupported(other)),
        }
    }

    pub fn decode<T: Message>(self, bytes: &[u8]) -> Result<T, ConnectError> {
        match self {
            Codec::Json => serde_json::from_slice(bytes)
                .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("bad JSON: {e}"))),
            Codec::Proto => T::decode(bytes).map_err(|e| {
                ConnectError::new(Code::InvalidArgument, format!("bad protobuf: {e}"))
            }),
        }
    }

    pub fn encode<T: Message>(self, message: &T) -> Bytes {
        match self {
            // Serializing generated types cannot fail (no maps with non-string keys).
            Codec::Json => Bytes::from(serde_json::to_vec(message).unwrap_or_default()),
            Codec::Proto => Bytes::from(message.encode_to_vec()),
        }
    }

    fn unary_content_type(self) -> &'static str {
        match self {
            Codec::Json => "application/json",
            Codec::Proto => "application/proto",
        }
    }

    fn stream_content_type(self) -> &'static str {
        match self {
            Codec::Json => "application/connect+json",
            Codec::Proto => "application/connect+proto",
        }
    }
}

fn content_type(headers: &HeaderMap) -> String {
    let value = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    value.split(';').next().unwrap_or("").trim().to_ascii_lowercase()
}

/// The deadline a client asked for (`Connect-Timeout-Ms`), if any.
pub fn deadline(headers: &HeaderMap) -> Option<Duration> {
    let ms: u64 = headers.get("connect-timeout-ms")?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_millis(ms))
}

/// Connect's error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
    DataLoss,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
            Code::DataLoss => "data_loss",
        }
    }

    /// The HTTP status of a unary error with this code (the protocol's table).
    pub fn status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
            Code::InvalidArgument => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// An RPC error: a Connect code and a message, or the gateway's "sandbox not running" answer
/// (HTTP 502 "… was not found"), which E2B's SDKs turn into their own not-running exception.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    #[error("{}: {message}", code.as_str())]
    Rpc { code: Code, message: String },
    #[error("the sandbox {0} was not found")]
    SandboxGone(String),
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> ConnectError {
        ConnectError::Rpc { code, message: message.into() }
    }

    fn unsupported(content_type: &str) -> ConnectError {
        ConnectError::new(
            Code::InvalidArgument,
            format!("content type {content_type:?} is not one this server speaks"),
        )
    }

    /// The end-of-stream message's `error` member.
    fn end_json(&self) -> serde_json::Value {
        let (code, message) = match self {
            ConnectError::Rpc { code, message } => (code.as_str(), message.clone()),
            ConnectError::SandboxGone(_) => (Code::Unavailable.as_str(), self.to_string()),
        };
        serde_json::json!({ "error": { "code": code, "message": message } })
    }
}

impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        match &self {
            ConnectError::SandboxGone(id) => sandbox_gone(id),
            ConnectError::Rpc { code, message } => {
                let body = serde_json::json!({ "code": code.as_str(), "message": message });
                (code.status(), [(header::CONTENT_TYPE, "application/json")], body.to_string())
                    .into_response()
            }
        }
    }
}

/// The answer for a sandbox that is not running (killed, expired, unknown): HTTP 502 whose
/// message says "was not found", on RPCs, `/files` and `/health` alike.
pub fn sandbox_gone(id: &str) -> Response {
    let body = serde_json::json!({
        "code": 502,
        "message": format!("The sandbox {id} was not found"),
        "sandboxId": id,
    });
    (StatusCode::BAD_GATEWAY, [(header::CONTENT_TYPE, "application/json")], body.to_string())
        .into_response()
}

/// A unary reply.
pub fn unary_reply<T: Message>(codec: Codec, result: Result<T, ConnectError>) -> Response {
    match result {
        Ok(message) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, codec.unary_content_type())],
            codec.encode(&message),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

/// Reads a unary request's body (at most [`MAX_MESSAGE`] bytes) and decodes it.
pub async fn unary_request<T: Message>(codec: Codec, body: Body) -> Result<T, ConnectError> {
    let bytes = tokio::time::timeout(MESSAGE_READ_TIMEOUT, axum::body::to_bytes(body, MAX_MESSAGE))
        .await
        .map_err(|_| slow_message())?
        .map_err(|e| ConnectError::new(Code::ResourceExhausted, format!("request body: {e}")))?;
    codec.decode(&bytes)
}

/// One envelope.
pub fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + payload.len());
    out.put_u8(flags);
    out.put_u32(payload.len() as u32);
    out.put_slice(payload);
    out.freeze()
}

/// A server-streaming reply: `messages` as envelopes, then the end-of-stream envelope (with the
/// error the stream ended on, if any).
pub fn stream_reply<T, S>(codec: Codec, messages: S) -> Response
where
    T: Message + Send,
    S: Stream<Item = Result<T, ConnectError>> + Send + 'static,
{
    let body = async_stream_body(codec, messages);
    let mut response = Response::new(Body::from_stream(body));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(codec.stream_content_type()));
    response
}

fn async_stream_body<T, S>(
    codec: Codec,
    messages: S,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> + Send
where
    T: Message + Send,
    S: Stream<Item = Result<T, ConnectError>> + Send + 'static,
{
    let messages = Box::pin(messages);
    futures::stream::unfold((messages, false), move |(mut messages, ended)| async move {
        if ended {
            return None;
        }
        match messages.next().await {
            Some(Ok(m)) => Some((Ok(envelope(0, &codec.encode(&m))), (messages, false))),
            Some(Err(e)) => {
                let end = e.end_json().to_string();
                Some((Ok(envelope(FLAG_END, end.as_bytes())), (messages, true)))
            }
            None => Some((Ok(envelope(FLAG_END, b"{}")), (messages, true))),
        }
    })
}

/// A streaming request's messages, decoded as they arrive.
pub struct EnvelopeReader {
    codec: Codec,
    body: axum::body::BodyDataStream,
    buf: BytesMut,
}

impl EnvelopeReader {
    pub fn new(codec: Codec, body: Body) -> EnvelopeReader {
        EnvelopeReader { codec, body: body.into_data_stream(), buf: BytesMut::new() }
    }

    /// The next message, or `None` at the end of the request (or its end-stream envelope).
    pub async fn next<T: Message>(&mut self) -> Result<Option<T>, ConnectError> {
        loop {
            if self.buf.len() >= 5 {
                let flags = self.buf[0];
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if len > MAX_MESSAGE {
                    return Err(ConnectError::new(
                        Code::ResourceExhausted,
                        format!("a {len}-byte message is over the {MAX_MESSAGE}-byte limit"),
                    ));
                }
                if self.buf.len() >= 5 + len {
                    self.buf.advance(5);
                    let payload = self.buf.split_to(len);
                    if flags & FLAG_COMPRESSED != 0 {
                        return Err(ConnectError::new(
                            Code::Unimplemented,
                            "compressed messages are not accepted",
                        ));
                    }
                    if flags & FLAG_END != 0 {
                        return Ok(None);
                    }
                    return self.codec.decode(&payload).map(Some);
                }
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    return Err(ConnectError::new(Code::Canceled, format!("request body: {e}")))
                }
                None if self.buf.is_empty() => return Ok(None),
                None => {
                    return Err(ConnectError::new(
                        Code::InvalidArgument,
                        "the request ended inside a message",
                    ))
                }
            }
        }
    }
}

fn slow_message() -> ConnectError {
    ConnectError::new(
        Code::DeadlineExceeded,
        format!("the request's message did not arrive within {MESSAGE_READ_TIMEOUT:?}"),
    )
}

/// Reads a server-streaming request's one message.
pub async fn single_stream_request<T: Message>(
    codec: Codec,
    body: Body,
) -> Result<T, ConnectError> {
    let collected = tokio::time::timeout(
        MESSAGE_READ_TIMEOUT,
        http_body_util::Limited::new(body, MAX_MESSAGE + 5).collect(),
    )
    .await
    .map_err(|_| slow_message())?
    .map_err(|e| ConnectError::new(Code::ResourceExhausted, format!("request body: {e}")))?
    .to_bytes();
    let mut reader = EnvelopeReader {
        codec,
        body: Body::empty().into_data_stream(),
        buf: BytesMut::from(&collected[..]),
    };
    reader
        .next()
        .await?
        .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "the request has no message"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, PartialEq, prost::Message, Serialize, serde::Deserialize)]
    struct Ping {
        #[prost(uint32, tag = "1")]
        n: u32,
    }

    #[tokio::test]
    async fn envelopes_round_trip_in_both_codecs_and_oversized_ones_are_refused() {
        for codec in [Codec::Json, Codec::Proto] {
            let mut body = Vec::new();
            for n in [1u32, 2, 300] {
                body.extend_from_slice(&envelope(0, &codec.encode(&Ping { n })));
            }
            body.extend_from_slice(&envelope(FLAG_END, b"{}"));
            // Delivered a few bytes at a time, as a slow client would.
            let chunks: Vec<Result<Bytes, std::io::Error>> =
                body.chunks(3).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
            let mut reader =
                EnvelopeReader::new(codec, Body::from_stream(futures::stream::iter(chunks)));
            let mut got = Vec::new();
            while let Some(p) = reader.next::<Ping>().await.expect("message") {
                got.push(p.n);
            }
            assert_eq!(got, vec![1, 2, 300]);
        }
        let mut huge = vec![0u8];
        huge.extend_from_slice(&(MAX_MESSAGE as u32 + 1).to_be_bytes());
        let mut reader = EnvelopeReader::new(Codec::Proto, Body::from(huge));
        let err = reader.next::<Ping>().await.expect_err("oversized");
        assert!(matches!(err, ConnectError::Rpc { code: Code::ResourceExhausted, .. }));
        let mut cut = envelope(0, &Codec::Proto.encode(&Ping { n: 7 })).to_vec();
        cut.pop();
        let mut reader = EnvelopeReader::new(Codec::Proto, Body::from(cut));
        assert!(reader.next::<Ping>().await.is_err(), "a message cut short is an error");
    }

    #[tokio::test]
    async fn a_stream_ends_with_an_end_envelope_carrying_its_error() {
        let messages = futures::stream::iter(vec![
            Ok(Ping { n: 1 }),
            Err(ConnectError::new(Code::DeadlineExceeded, "too slow")),
        ]);
        let body: Vec<Bytes> =
            async_stream_body(Codec::Json, messages).map(|b| b.unwrap_or_default()).collect().await;
        assert_eq!(body.len(), 2);
        assert_eq!(body[0][0], 0);
        assert_eq!(&body[0][5..], br#"{"n":1}"#);
        assert_eq!(body[1][0], FLAG_END);
        let end: serde_json::Value = serde_json::from_slice(&body[1][5..]).expect("json");
        assert_eq!(end["error"]["code"], "deadline_exceeded");
    }
}
