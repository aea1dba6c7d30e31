//! The APIs beyond completions and chat, over HTTP: `/v1/responses`, the pooling APIs
//! (embeddings, pooling, classify, score, rerank), tokenize/detokenize, conversations
//! and audio. Shapes as vLLM's, the engine and its metrics where vLLM uses them.

mod common;

use common::{metric, start, zero_config, Client};
use serde_json::{json, Value};
use vllm_sim::tokenizer;

const SUCCESS_STOP: &str =
    "vllm:request_success_total{finished_reason=\"stop\",model_name=\"sim-model\"}";

async fn metrics(c: &mut Client) -> String {
    c.call("GET", "/metrics", "").await.1
}

/// `event:`/`data:` frames of a Responses stream.
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|f| {
            let (event, data) = f.split_once('\n').expect("event and data lines");
            let kind = event
                .strip_prefix("event: ")
                .expect("event line")
                .to_string();
            let data = serde_json::from_str(data.strip_prefix("data: ").expect("data line"))
                .expect("data is JSON");
            (kind, data)
        })
        .collect()
}

#[tokio::test]
async fn responses_answer_a_response_object_through_the_engine() {
    let server = start(zero_config()).await;
    let addr = server.addrs()[0];
    let mut c = Client::connect(addr).await;
    let body = json!({"model": "sim-model", "input": "Tell me something", "instructions": "Be brief.",
                      "max_output_tokens": 4, "metadata": {"k": "v"}});
    let (status, text, headers) = c.call("POST", "/v1/responses", &body.to_string()).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(headers["x-sim-server"], addr.to_string().as_str());
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["object"], "response");
    assert!(v["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(v["model"], "sim-model");
    assert_eq!(v["instructions"], "Be brief.");
    assert_eq!(v["metadata"], json!({"k": "v"}));
    assert_eq!(v["max_output_tokens"], 4);
    assert!(["completed", "incomplete"].contains(&v["status"].as_str().unwrap()));
    let message = &v["output"][0];
    assert_eq!(message["type"], "message");
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["content"][0]["type"], "output_text");
    assert!(!message["content"][0]["text"].as_str().unwrap().is_empty());
    let usage = &v["usage"];
    let prompt = "<|system|>\nBe brief.\n<|user|>\nTell me something\n<|assistant|>\n";
    assert_eq!(usage["input_tokens"], tokenizer::count(prompt));
    let output = usage["output_tokens"].as_u64().unwrap();
    assert!((1..=4).contains(&output));
    assert_eq!(
        usage["total_tokens"],
        tokenizer::count(prompt) as u64 + output
    );
    let m = metrics(&mut c).await;
    let finished = metric(&m, SUCCESS_STOP).unwrap_or(0.0)
        + metric(
            &m,
            "vllm:request_success_total{finished_reason=\"length\",model_name=\"sim-model\"}",
        )
        .unwrap_or(0.0);
    assert_eq!(finished, 1.0, "{m}");
    assert_eq!(
        metric(&m, "vllm:generation_tokens_total{model_name=\"sim-model\"}"),
        Some(output as f64)
    );

    // `max_output_tokens` beyond the context window is capped, not refused.
    let (status, v) = c
        .post_json(
            "/v1/responses",
            json!({"input": "hi", "max_output_tokens": 1_000_000}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let prompt = tokenizer::count("<|user|>\nhi\n<|assistant|>\n");
    assert_eq!(v["max_output_tokens"], 4096 - prompt);

    // Without input: vLLM's 400, naming the field.
    let (status, v) = c
        .post_json("/v1/responses", json!({"model": "sim-model"}))
        .await;
    assert_eq!(status, 400);
    assert_eq!(v["error"]["type"], "BadRequestError");
    assert_eq!(v["error"]["param"], "input");
}

#[tokio::test]
async fn streamed_responses_are_events_from_created_to_completed() {
    let server = start(zero_config()).await;
    let mut c = Client::connect(server.addrs()[0]).await;
    let body = json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
                      "max_output_tokens": 3, "stream": true});
    let (status, text, headers) = c.call("POST", "/v1/responses", &body.to_string()).await;
    assert_eq!(status, 200, "{text}");
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let frames = events(&text);
    let kinds: Vec<&str> = frames.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        &kinds[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(kinds.last(), Some(&"response.completed"));
    let deltas: Vec<&str> = frames
        .iter()
        .filter(|(k, _)| k == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert!((1..=3).contains(&deltas.len()), "{kinds:?}");
    for (i, (kind, data)) in frames.iter().enumerate() {
        assert_eq!(data["type"], kind.as_str());
        assert_eq!(data["sequence_number"], i);
    }
    let done = &frames.last().unwrap().1["response"];
    assert_eq!(done["output"][0]["content"][0]["text"], deltas.concat());
    assert_eq!(done["usage"]["output_tokens"], deltas.len());
    assert!(!text.contains("[DONE]"));
}

#[tokio::test]
async fn embeddings_are_one_deterministic_vector_per_input() {
    let server = start(zero_config()).await;
    let mut c = Client::connect(server.addrs()[0]).await;
    let input = ["The first sentence to embed.", "A second one."];
    let (status, v) = c
        .post_json(
            "/v1/embeddings",
            json!({"model": "sim-model", "input": input}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], "sim-model");
    assert!(v["id"].as_str().unwrap().starts_with("embd-"));
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["index"], i);
        assert_eq!(d["object"], "embedding");
        assert_eq!(d["embedding"].as_array().unwrap().len(), 8);
    }
    let tokens: usize = input.iter().map(|s| tokenizer::count(s)).sum();
    assert_eq!(v["usage"]["prompt_tokens"], tokens);
    assert_eq!(v["usage"]["total_tokens"], tokens);
    // The same text, the same vector.
    let (_, again) = c
        .post_json("/v1/embeddings", json!({"input": input[1]}))
        .await;
    assert_eq!(again["data"][0]["embedding"], data[1]["embedding"]);

    // Bodies it cannot read: vLLM-style 400s.
    let (status, v) = c
        .post_json("/v1/embeddings", json!({"model": "sim-model"}))
        .await;
    assert_eq!(status, 400);
    assert_eq!(v["error"]["param"], "input");
    let (status, text, headers) = c.call("POST", "/v1/embeddings", "not json at all").await;
    assert_eq!(status, 400, "{text}");
    assert!(headers.contains_key("x-sim-server"));
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["type"], "BadRequestError");
    let (status, v) = c
        .post_json("/v1/embeddings", json!({"model": "other", "input": "x"}))
        .await;
    assert_eq!(status, 404);
    assert_eq!(v["error"]["type"], "NotFoundError");
}

#[tokio::test]
async fn pooling_requests_prefill_only_count_as_stop_and_share_the_prefix_cache() {
    let server = start(zero_config()).await;
    let mut c = Client::connect(server.addrs()[0]).await;
    let long = "A long document shared by two embedding requests. ".repeat(20);
    for _ in 0..2 {
        let (status, v) = c.post_json("/v1/embeddings", json!({"input": long})).await;
        assert_eq!(status, 200, "{v}");
    }
    let m = metrics(&mut c).await;
    assert_eq!(metric(&m, SUCCESS_STOP), Some(2.0), "{m}");
    assert_eq!(
        metric(&m, "vllm:generation_tokens_total{model_name=\"sim-model\"}"),
        Some(0.0)
    );
    let prompt = tokenizer::count(&long) as f64;
    assert_eq!(
        metric(&m, "vllm:prompt_tokens_total{model_name=\"sim-model\"}"),
        Some(2.0 * prompt)
    );
    // The second request found the first one's full blocks.
    let hits = metric(&m, "vllm:prefix_cache_hits_total{model_name=\"sim-model\"}").unwrap();
    assert_eq!(hits, ((prompt as usize - 1) / 16 * 16) as f64);
    assert_eq!(
        metric(
            &m,
            "vllm:time_to_first_token_seconds_count{model_name=\"sim-model\"}"
        ),
        Some(2.0)
    );
}

#[tokio::test]
async fn pooling_classify_score_and_rerank_have_vllms_shapes() {
    let server = start(zero_config()).await;
    let mut c = Client::connect(server.addrs()[0]).await;

    let (status, v) = c
        .post_json("/pooling", json!({"input": ["one", "two"]}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][1]["object"], "pooling");
    assert_eq!(v["data"][1]["index"], 1);
    assert_eq!(v["data"][1]["data"].as_array().unwrap().len(), 8);

    let (status, v) = c
        .post_json("/classify", json!({"input": "classify me"}))
        .await;
    assert_eq!(status, 200, "{v}");
    let d = &v["data"][0];
    assert_eq!(d["index"], 0);
    assert_eq!(d["num_classes"], 2);
    assert_eq!(d["probs"].as_array().unwrap().len(), 2);
    assert!(d["label"].is_string());

    for path in ["/score", "/v1/score"] {
        let (status, v) = c
            .post_json(
                path,
                json!({"text_1": "what is a cat?", "text_2": ["a cat is an animal", "a car"]}),
            )
            .await;
        assert_eq!(status, 200, "{path}: {v}");
        assert_eq!(v["object"], "list");
        let data = v["data"].as_array().unwrap();
        assert_eq!(data.len(), 2);
        assert_eq!(data[1]["object"], "score");
        assert_eq!(data[1]["index"], 1);
        assert!(data[1]["score"].is_f64());
    }

    for path in ["/rerank", "/v1/rerank", "/v2/rerank"] {
        let docs = ["first document", "second document", "third document"];
        let (status, v) = c
            .post_json(path, json!({"query": "which one?", "documents": docs}))
            .await;
        assert_eq!(status, 200, "{path}: {v}");
        let results = v["results"].as_array().unwrap();
        assert_eq!(results.len(), 3);
        let scores: Vec<f64> = results
            .iter()
            .map(|r| r["relevance_score"].as_f64().unwrap())
            .collect();
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
        for r in results {
            let i = r["index"].as_u64().unwrap() as usize;
            assert_eq!(r["document"]["text"], docs[i]);
        }
        assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
        assert_eq!(v["usage"]["total_tokens"], v["usage"]["prompt_tokens"]);
    }

    let (status, v) = c
        .post_json(
            "/score",
            json!({"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}),
        )
        .await;
    assert_eq!(status, 400, "{v}");
    let (status, _) = c.post_json("/rerank", json!({"documents": ["a"]})).await;
    assert_eq!(status, 400);
    let m = metrics(&mut c).await;
    // 2 + 1 + 2 + 2 + 3 × 3 pooled items.
    assert_eq!(metric(&m, SUCCESS_STOP), Some(16.0), "{m}");
}

#[tokio::test]
async fn tokenize_and_detokenize_round_trip_without_the_engine() {
    let server = start(zero_config()).await;
    let mut c = Client::connect(server.addrs()[0]).await;
    let text = "Round trip through the tokenizer.";
    let (status, v) = c
        .post_json("/tokenize", json!({"model": "sim-model", "prompt": text}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["count"], tokenizer::count(text));
    assert_eq!(v["max_model_len"], 4096);
    assert_eq!(v["tokens"], json!(tokenizer::encode(text)));
    assert!(v["token_strs"].is_null());
    let (status, d) = c
        .post_json("/detokenize", json!({"tokens": v["tokens"]}))
        .await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(d, json!({ "prompt": text }));

    let (_, v) = c
        .post_json(
            "/tokenize",
            json!({"messages": [{"role": "user", "content": "hi"}], "return_token_strs": true}),
        )
        .await;
    assert_eq!(
        v["count"],
        tokenizer::count("<|user|>\nhi\n<|assistant|>\n")
    );
    assert_eq!(v["token_strs"][0], "<|us");

    assert_eq!(c.post_json("/tokenize", json!({})).await.0, 400);
    assert_eq!(
        c.post_json("/detokenize", json!({"tokens": "x"})).await.0,
        400
    );
    let m = metrics(&mut c).await;
    assert_eq!(
        metric(&m, SUCCESS_STOP).unwrap_or(0.0),
        0.0,
        "tokenize never reaches the engine"
    );
}

#[tokio::test]
async fn conversations_live_in_the_server_that_created_them() {
    let server = start(zero_config()).await;
    let mut c = Client::connect(server.addrs()[0]).await;
    let (status, v) = c
        .post_json(
            "/v1/conversations",
            json!({"metadata": {"topic": "test"}, "items": [{"type": "message", "role": "user", "content": "hello"}]}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "conversation");
    assert_eq!(v["metadata"], json!({"topic": "test"}));
    assert!(v["created_at"].is_u64());
    let id = v["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("conv_"));

    let (status, text, _) = c.call("GET", &format!("/v1/conversations/{id}"), "").await;
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), v);

    let (status, items) = c
        .post_json(
            &format!("/v1/conversations/{id}/items"),
            json!({"items": [{"role": "assistant", "content": "hi"}]}),
        )
        .await;
    assert_eq!(status, 200, "{items}");
    assert_eq!(items["object"], "list");
    let (_, text, _) = c
        .call("GET", &format!("/v1/conversations/{id}/items"), "")
        .await;
    let all: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(all["data"].as_array().unwrap().len(), 2);

    let (status, text, _) = c.call("GET", "/v1/conversations/conv_unknown", "").await;
    assert_eq!(status, 404);
    let e: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(e["error"]["type"], "NotFoundError");

    let (status, text, _) = c
        .call("DELETE", &format!("/v1/conversations/{id}"), "")
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["deleted"],
        true
    );
    let (status, _, _) = c.call("GET", &format!("/v1/conversations/{id}"), "").await;
    assert_eq!(status, 404);
    assert_eq!(c.call("POST", "/v1/conversations", "{").await.0, 400);
    assert_eq!(c.call("PUT", "/v1/conversations", "").await.0, 405);
}

fn multipart(boundary: &str, model: &str, audio: &[u8]) -> Vec<u8> {
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{model}\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\
         Content-Type: audio/wav\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(audio);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    body
}

#[tokio::test]
async fn audio_transcriptions_and_translations_accept_multipart() {
    let server = start(zero_config()).await;
    let mut c = Client::connect(server.addrs()[0]).await;
    let audio: Vec<u8> = (0..96_000u32).map(|i| b' ' + (i % 64) as u8).collect();
    let body = multipart("sim-boundary", "sim-model", &audio);
    let body = String::from_utf8(body).unwrap();
    let content_type = ("content-type", "multipart/form-data; boundary=sim-boundary");
    let (status, text, headers) = c
        .call_with("POST", "/v1/audio/transcriptions", &body, &[content_type])
        .await;
    assert_eq!(status, 200, "{text}");
    assert!(headers.contains_key("x-sim-server"));
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(!v["text"].as_str().unwrap().is_empty());
    assert_eq!(v["usage"], json!({"type": "duration", "seconds": 3}));

    let (status, text, _) = c
        .call_with("POST", "/v1/audio/translations", &body, &[content_type])
        .await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(v["text"].is_string() && v.get("usage").is_none());

    // JSON is not a form: 400.
    let (status, text, _) = c
        .call(
            "POST",
            "/v1/audio/transcriptions",
            r#"{"model":"sim-model"}"#,
        )
        .await;
    assert_eq!(status, 400, "{text}");
    let m = metrics(&mut c).await;
    let finished: f64 = ["stop", "length"]
        .iter()
        .filter_map(|r| {
            metric(
                &m,
                &format!("vllm:request_success_total{{finished_reason=\"{r}\",model_name=\"sim-model\"}}"),
            )
        })
        .sum();
    assert_eq!(finished, 2.0, "{m}");
}

#[tokio::test]
async fn every_new_endpoint_names_the_server_and_refuses_other_methods() {
    let server = start(zero_config()).await;
    let addr = server.addrs()[0].to_string();
    let mut c = Client::connect(server.addrs()[0]).await;
    for path in [
        "/v1/responses",
        "/v1/embeddings",
        "/pooling",
        "/classify",
        "/score",
        "/v1/score",
        "/rerank",
        "/v1/rerank",
        "/v2/rerank",
        "/tokenize",
        "/detokenize",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
    ] {
        let (status, _, headers) = c.call("GET", path, "").await;
        assert_eq!(status, 405, "{path}");
        assert_eq!(headers["x-sim-server"], addr.as_str(), "{path}");
        let (status, text, headers) = c.call("POST", path, "{").await;
        assert_eq!(status, 400, "{path}: {text}");
        assert_eq!(headers["x-sim-server"], addr.as_str(), "{path}");
    }
}
