//! A model directory as vLLM reads one, built offline: a byte-level BPE `tokenizer.json`
//! trained here (Llama 3's structure: `ByteLevel` pre-tokenizer and decoder, special
//! tokens, a post-processor adding `<|begin_of_text|>`) and a `tokenizer_config.json`
//! with a Llama-3.1-style chat template (a system header always, contents trimmed).

use std::path::PathBuf;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, Tokenizer};

pub const BOS: &str = "<|begin_of_text|>";

pub const TEMPLATE: &str = r#"{{ bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set rest = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
    {%- set rest = messages %}
{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\n\nKnowledge cutoff: 2023\n\n' + system_message + '<|eot_id|>' }}
{%- for message in rest %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}"#;

const CORPUS: &[&str] = &[
    "You are a helpful assistant. Answer the question as briefly as you can.",
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.",
    "Prefix caching keeps the key and value tensors of a prompt's leading tokens.",
    "A gateway routes each request to the model server that holds most of its prefix.",
    "What is the capital of France? Paris is the capital and largest city of France.",
    "def main():\n    print('hello, world')\n    return 0\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 2023 2024 2025.",
];

/// Builds the model directory under a fresh temporary path.
pub fn model_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kv-relay-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let specials = [
        BOS,
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
    ];
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(700)
        .min_frequency(1)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(
            specials
                .iter()
                .map(|s| AddedToken::from(*s, true))
                .collect(),
        )
        .build()
        .into();
    let mut tokenizer = Tokenizer::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    let corpus: Vec<String> = CORPUS.iter().map(|s| s.repeat(3)).collect();
    tokenizer
        .train(&mut trainer, corpus.iter())
        .expect("trains");
    let bos = tokenizer.token_to_id(BOS).expect("BOS is a token");
    let mut template = TemplateProcessing::builder();
    template
        .try_single(format!("{BOS} $A"))
        .expect("template")
        .special_tokens(vec![(BOS.to_string(), bos)]);
    tokenizer.with_post_processor(Some(template.build().expect("post-processor")));
    tokenizer
        .save(dir.join("tokenizer.json"), false)
        .expect("saves");
    let config = serde_json::json!({
        "bos_token": BOS,
        "eos_token": "<|eot_id|>",
        "chat_template": TEMPLATE,
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).expect("writes");
    dir
}
