//! `/v1/audio/transcriptions` and `/v1/audio/translations`: `multipart/form-data`
//! bodies with a `file` part (and optional `model`, `prompt`, `language`,
//! `response_format` fields), answered `{"text": …}` as vLLM does (transcriptions also
//! with `usage: {type: "duration", seconds}`).
//!
//! The audio is not decoded. Its length is estimated as 16 kHz 16-bit mono PCM
//! ([`BYTES_PER_SECOND`]), and it becomes [`TOKENS_PER_SECOND`] prompt tokens per
//! second (Whisper's encoder frames), at most one 30 s window ([`MAX_AUDIO_TOKENS`]),
//! hashed from the bytes so that the same audio gives the same tokens; the text is what
//! the engine generates.

use super::errors::ApiError;
use crate::tokenizer;
use serde_json::json;

/// Which audio endpoint a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AudioApi {
    Transcription,
    Translation,
}

/// Assumed audio bytes per second (16 kHz, 16-bit, mono).
pub const BYTES_PER_SECOND: usize = 32_000;

/// Prompt tokens per second of audio.
pub const TOKENS_PER_SECOND: usize = 50;

/// Prompt tokens of one 30 s window, the most a request gets.
pub const MAX_AUDIO_TOKENS: usize = 30 * TOKENS_PER_SECOND;

/// One part of a multipart body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part<'a> {
    pub name: String,
    pub filename: Option<String>,
    pub data: &'a [u8],
}

/// A parsed audio request.
#[derive(Clone, Debug, PartialEq)]
pub struct AudioRequest {
    pub api: AudioApi,
    pub model: Option<String>,
    /// Size of the `file` part.
    pub audio_bytes: usize,
    /// The engine prompt: the audio's tokens, then the task and the `prompt` field.
    pub prompt: Vec<u32>,
    /// `response_format: "text"` (a plain-text body) rather than `json`.
    pub text_format: bool,
}

impl AudioRequest {
    /// The audio's duration in whole seconds (at least 1), as `usage.seconds`.
    pub fn seconds(&self) -> usize {
        self.audio_bytes.div_ceil(BYTES_PER_SECOND).max(1)
    }
}

/// The boundary of a `multipart/form-data` content type.
pub fn boundary(content_type: &str) -> Option<&str> {
    let mut params = content_type.split(';');
    let kind = params.next()?.trim();
    if !kind.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"'))
            .filter(|b| !b.is_empty())
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The parts of a multipart body (RFC 7578). Errors on a body that is not one.
pub fn parts<'a>(body: &'a [u8], boundary: &str) -> Result<Vec<Part<'a>>, ApiError> {
    let bad = || ApiError::bad_request("invalid multipart/form-data body");
    let delimiter = format!("--{boundary}");
    let next_delimiter = format!("\r\n--{boundary}");
    let mut rest = &body[find(body, delimiter.as_bytes()).ok_or_else(bad)? + delimiter.len()..];
    let mut parts = Vec::new();
    loop {
        if rest.starts_with(b"--") {
            return Ok(parts);
        }
        rest = rest.strip_prefix(b"\r\n").ok_or_else(bad)?;
        let head_end = find(rest, b"\r\n\r\n").ok_or_else(bad)?;
        let head = String::from_utf8_lossy(&rest[..head_end]);
        let content = &rest[head_end + 4..];
        let end = find(content, next_delimiter.as_bytes()).ok_or_else(bad)?;
        let mut name = None;
        let mut filename = None;
        for line in head.split("\r\n") {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            if !key.trim().eq_ignore_ascii_case("content-disposition") {
                continue;
            }
            for param in value.split(';').skip(1) {
                if let Some((k, v)) = param.split_once('=') {
                    let v = v.trim().trim_matches('"').to_string();
                    match k.trim() {
                        "name" => name = Some(v),
                        "filename" => filename = Some(v),
                        _ => {}
                    }
                }
            }
        }
        parts.push(Part {
            name: name.ok_or_else(bad)?,
            filename,
            data: &content[..end],
        });
        rest = &content[end + next_delimiter.len()..];
    }
}

/// Parses a request from its `Content-Type` and body. Errors are 400s.
pub fn parse(
    api: AudioApi,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<AudioRequest, ApiError> {
    let boundary = content_type.and_then(boundary).ok_or_else(|| {
        ApiError::bad_request("Content-Type must be multipart/form-data with a boundary")
    })?;
    let parts = parts(body, boundary)?;
    let field = |name: &str| {
        parts
            .iter()
            .find(|p| p.name == name)
            .map(|p| String::from_utf8_lossy(p.data).into_owned())
    };
    let file = parts
        .iter()
        .find(|p| p.name == "file")
        .ok_or_else(|| ApiError::bad_request("Field required: `file`").with_param("file"))?;
    let text_format = match field("response_format").as_deref() {
        None | Some("json") => false,
        Some("text") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "response_format '{other}' is not supported by vllm-sim (json, text)"
            ))
            .with_param("response_format"))
        }
    };
    if field("stream").is_some_and(|s| s.trim() == "true") {
        return Err(ApiError::bad_request(
            "streamed audio responses are not supported by vllm-sim",
        )
        .with_param("stream"));
    }
    let audio_tokens = file
        .data
        .len()
        .div_ceil(BYTES_PER_SECOND / TOKENS_PER_SECOND);
    let mut prompt: Vec<u32> = file
        .data
        .chunks(BYTES_PER_SECOND / TOKENS_PER_SECOND)
        .take(audio_tokens.clamp(1, MAX_AUDIO_TOKENS))
        .map(|chunk| {
            chunk.iter().fold(0x811c_9dc5u32, |h, b| {
                (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
            })
        })
        .collect();
    if prompt.is_empty() {
        prompt.push(0x811c_9dc5); // an empty file still has one frame
    }
    let task = match api {
        AudioApi::Transcription => "<|startoftranscript|><|transcribe|>",
        AudioApi::Translation => "<|startoftranscript|><|translate|>",
    };
    let text_prompt = field("prompt").unwrap_or_default();
    prompt.extend(tokenizer::encode(&format!("{task}{text_prompt}")));
    Ok(AudioRequest {
        api,
        model: field("model").filter(|m| !m.is_empty()),
        audio_bytes: file.data.len(),
        prompt,
        text_format,
    })
}

/// The JSON response body for the generated `text`.
pub fn response_json(request: &AudioRequest, text: &str) -> String {
    match request.api {
        AudioApi::Transcription => json!({"text": text,
                                          "usage": {"type": "duration", "seconds": request.seconds()}}),
        AudioApi::Translation => json!({ "text": text }),
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A multipart body with the given text fields and a `file` of `audio` bytes.
    fn multipart(boundary: &str, fields: &[(&str, &str)], audio: Option<&[u8]>) -> Vec<u8> {
        let mut body = Vec::new();
        for (name, value) in fields {
            body.extend_from_slice(
                format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n")
                    .as_bytes(),
            );
        }
        if let Some(audio) = audio {
            body.extend_from_slice(
                format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n")
                    .as_bytes(),
            );
            body.extend_from_slice(audio);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
        body
    }

    #[test]
    fn multipart_fields_and_the_file_are_found() {
        let audio = vec![7u8; 64_001];
        let body = multipart(
            "XyZ",
            &[("model", "whisper"), ("language", "en")],
            Some(&audio),
        );
        assert_eq!(
            boundary("multipart/form-data; boundary=\"XyZ\""),
            Some("XyZ")
        );
        assert_eq!(boundary("application/json"), None);
        let parts = parts(&body, "XyZ").unwrap();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[2].filename.as_deref(), Some("a.wav"));
        assert_eq!(parts[2].data.len(), audio.len());

        let r = parse(
            AudioApi::Transcription,
            Some("multipart/form-data; boundary=XyZ"),
            &body,
        )
        .unwrap();
        assert_eq!(r.model.as_deref(), Some("whisper"));
        assert_eq!(r.seconds(), 3);
        let audio_tokens = 64_001usize.div_ceil(640);
        assert!(r.prompt.len() > audio_tokens);
        let v: serde_json::Value = serde_json::from_str(&response_json(&r, "hello")).unwrap();
        assert_eq!(
            v,
            json!({"text": "hello", "usage": {"type": "duration", "seconds": 3}})
        );
        let t = parse(
            AudioApi::Translation,
            Some("multipart/form-data; boundary=XyZ"),
            &body,
        )
        .unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&response_json(&t, "hi")).unwrap(),
            json!({"text": "hi"})
        );
        // The same audio, the same audio tokens.
        assert_eq!(t.prompt[..audio_tokens], r.prompt[..audio_tokens]);
    }

    #[test]
    fn bodies_it_cannot_read_are_400s() {
        let ct = Some("multipart/form-data; boundary=b");
        let no_file = multipart("b", &[("model", "m")], None);
        let e = parse(AudioApi::Transcription, ct, &no_file).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("file")));
        let json = br#"{"model":"m"}"#;
        assert_eq!(
            parse(AudioApi::Transcription, Some("application/json"), json)
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            parse(AudioApi::Transcription, ct, b"garbage")
                .unwrap_err()
                .status,
            400
        );
        let srt = multipart("b", &[("response_format", "srt")], Some(b"abc"));
        assert_eq!(
            parse(AudioApi::Transcription, ct, &srt).unwrap_err().status,
            400
        );
        let text = multipart("b", &[("response_format", "text")], Some(b""));
        let r = parse(AudioApi::Transcription, ct, &text).unwrap();
        assert!(r.text_format);
        assert_eq!(r.seconds(), 1);
    }
}
