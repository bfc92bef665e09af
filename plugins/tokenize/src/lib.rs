//! `tokenize`: a Hugging Face `tokenizer.json` (WordPiece/BERT, and the other models the same
//! file format describes) applied to a batch of texts, with the `tokenizers` crate itself, so
//! that ids match the Python package's exactly.
//!
//! Input `TEXT` (BYTES, UTF-8, one text per element; `[batch, 1]` or `[batch]`) → outputs
//! `input_ids`, `attention_mask`, `token_type_ids` (INT64, `[batch, length]`), padded to the
//! longest text of the request and truncated to `max_length`; and `token_count` (INT64
//! `[batch, 1]`), each text's tokens after truncation, special tokens included (what an API
//! reports as usage).
//!
//! Parameters:
//! - `tokenizer`: the file, inside the read-only directory granted with
//!   `wasm.allow_read_dir` (mounted at `/data`); default `tokenizer.json`;
//! - `max_length`: tokens per text at most, special tokens included (1..=8192; default: the
//!   file's own truncation, else 512);
//! - `add_special_tokens`: `true` (default: `[CLS] … [SEP]` for BERT) or `false`;
//! - `pad_to_multiple_of`: round the padded length up to a multiple of this (1..=512; default:
//!   none). Texts of nearby lengths then leave with the same length, so a model after this step
//!   can batch them together (its batcher only batches equal shapes).

use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};
use wisp_sdk::{Error, Params, Plugin, Request, Response, Tensor};

/// The plugin: a loaded tokenizer and its settings.
pub struct Tokenize {
    tokenizer: Tokenizer,
    special: bool,
}

/// The most tokens per text a config may ask for.
const MAX_LENGTH: usize = 8192;

impl Tokenize {
    /// A tokenizer from `tokenizer.json` text, truncating to `max_length` and padding to the
    /// longest text of a call.
    pub fn from_json(
        json: &[u8],
        max_length: Option<usize>,
        special: bool,
        multiple_of: Option<usize>,
    ) -> Result<Self, Error> {
        let mut tokenizer = Tokenizer::from_bytes(json)
            .map_err(|e| Error::invalid(format!("tokenizer file: {e}")))?;
        let length = max_length
            .or_else(|| tokenizer.get_truncation().map(|t| t.max_length))
            .unwrap_or(512);
        if !(1..=MAX_LENGTH).contains(&length) {
            return Err(Error::invalid(format!(
                "parameter 'max_length' must be 1 to {MAX_LENGTH}, not {length}"
            )));
        }
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: length,
                ..Default::default()
            }))
            .map_err(|e| Error::invalid(format!("truncation: {e}")))?;
        let padding = tokenizer.get_padding().cloned().unwrap_or_default();
        if let Some(m) = multiple_of {
            if !(1..=512).contains(&m) {
                return Err(Error::invalid(format!(
                    "parameter 'pad_to_multiple_of' must be 1 to 512, not {m}"
                )));
            }
        }
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            pad_to_multiple_of: multiple_of,
            ..padding
        }));
        Ok(Tokenize { tokenizer, special })
    }

    /// The three tensors for `texts`, `rows` rows of one text each.
    pub fn encode(&self, texts: Vec<String>, rows: i64) -> Result<Vec<Tensor>, Error> {
        let encodings = self
            .tokenizer
            .encode_batch(texts, self.special)
            .map_err(|e| Error::invalid(format!("tokenizing: {e}")))?;
        let length = encodings.first().map_or(0, |e| e.len()) as i64;
        let column = |f: &dyn Fn(&tokenizers::Encoding) -> &[u32]| -> Vec<i64> {
            encodings
                .iter()
                .flat_map(|e| f(e).iter().map(|&v| i64::from(v)))
                .collect()
        };
        let shape = vec![rows, length];
        Ok(vec![
            Tensor::from_i64("input_ids", shape.clone(), &column(&|e| e.get_ids())),
            Tensor::from_i64(
                "attention_mask",
                shape.clone(),
                &column(&|e| e.get_attention_mask()),
            ),
            Tensor::from_i64("token_type_ids", shape, &column(&|e| e.get_type_ids())),
            Tensor::from_i64(
                "token_count",
                vec![rows, 1],
                &encodings
                    .iter()
                    .map(|e| e.get_attention_mask().iter().map(|&m| i64::from(m)).sum())
                    .collect::<Vec<i64>>(),
            ),
        ])
    }
}

impl Plugin for Tokenize {
    fn init(params: &Params) -> Result<Self, Error> {
        let file = params.get("tokenizer").unwrap_or("tokenizer.json");
        if file.contains("..") || file.starts_with('/') {
            return Err(Error::invalid(format!(
                "parameter 'tokenizer' names a file inside the granted directory, not '{file}'"
            )));
        }
        let path = format!("/data/{file}");
        let json = std::fs::read(&path).map_err(|e| {
            Error::invalid(format!(
                "cannot read {path} ({e}): grant the directory holding it with wasm.allow_read_dir"
            ))
        })?;
        let max_length = match params.get("max_length").map(str::trim) {
            None | Some("") => None,
            Some(v) => Some(v.parse::<usize>()?),
        };
        let multiple_of = match params.get("pad_to_multiple_of").map(str::trim) {
            None | Some("") => None,
            Some(v) => Some(v.parse::<usize>()?),
        };
        Tokenize::from_json(
            &json,
            max_length,
            params.parse_or("add_special_tokens", true)?,
            multiple_of,
        )
    }

    fn execute(&mut self, request: &Request) -> Result<Response, Error> {
        let text = request.input("TEXT")?;
        let rows = text.shape.first().copied().unwrap_or(0);
        let texts = text
            .strings()?
            .into_iter()
            .enumerate()
            .map(|(i, b)| {
                String::from_utf8(b.to_vec())
                    .map_err(|_| Error::invalid(format!("TEXT element {i} is not UTF-8")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if texts.len() as i64 != rows {
            return Err(Error::invalid(format!(
                "TEXT holds {} texts for {rows} rows: one text per row",
                texts.len()
            )));
        }
        Ok(Response::new(self.encode(texts, rows)?))
    }
}

wisp_sdk::export_plugin!(Tokenize);

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny WordPiece tokenizer in the tokenizer.json format.
    fn tiny() -> Vec<u8> {
        br###"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
        "normalizer":{"type":"BertNormalizer","clean_text":true,"handle_chinese_chars":true,"strip_accents":null,"lowercase":true},
        "pre_tokenizer":{"type":"BertPreTokenizer"},
        "post_processor":{"type":"TemplateProcessing",
          "single":[{"SpecialToken":{"id":"[CLS]","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"[SEP]","type_id":0}}],
          "pair":[{"SpecialToken":{"id":"[CLS]","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"[SEP]","type_id":0}},{"Sequence":{"id":"B","type_id":1}},{"SpecialToken":{"id":"[SEP]","type_id":1}}],
          "special_tokens":{"[CLS]":{"id":"[CLS]","ids":[2],"tokens":["[CLS]"]},"[SEP]":{"id":"[SEP]","ids":[3],"tokens":["[SEP]"]}}},
        "decoder":null,
        "model":{"type":"WordPiece","unk_token":"[UNK]","continuing_subword_prefix":"##","max_input_chars_per_word":100,
          "vocab":{"[PAD]":0,"[UNK]":1,"[CLS]":2,"[SEP]":3,"hello":4,"world":5,"wis":6,"##p":7}}}"###
            .to_vec()
    }

    #[test]
    fn pads_to_the_longest_and_truncates() {
        let t = Tokenize::from_json(&tiny(), Some(4), true, None).unwrap();
        let out = t
            .encode(vec!["Hello WISP world".into(), "hello".into()], 2)
            .unwrap();
        assert_eq!(out[0].shape, vec![2, 4]);
        assert_eq!(out[0].to_i64().unwrap(), vec![2, 4, 6, 3, 2, 4, 3, 0]);
        assert_eq!(out[1].to_i64().unwrap(), vec![1, 1, 1, 1, 1, 1, 1, 0]);
        assert_eq!(out[3].name, "token_count");
        assert_eq!(out[3].shape, vec![2, 1]);
        assert_eq!(
            out[3].to_i64().unwrap(),
            vec![4, 3],
            "after truncation, specials included"
        );
        assert!(Tokenize::from_json(&tiny(), Some(0), true, None).is_err());
        assert!(Tokenize::from_json(b"{}", None, true, None).is_err());
        assert!(Tokenize::from_json(&tiny(), None, true, Some(0)).is_err());
    }

    #[test]
    fn pads_to_a_multiple() {
        let t = Tokenize::from_json(&tiny(), None, true, Some(4)).unwrap();
        let out = t.encode(vec!["hello world wisp".into()], 1).unwrap();
        // [CLS] hello world wis ##p [SEP] = 6 tokens, padded to 8; the count stays 6.
        assert_eq!(out[0].shape, vec![1, 8]);
        assert_eq!(out[1].to_i64().unwrap(), vec![1, 1, 1, 1, 1, 1, 0, 0]);
        assert_eq!(out[3].to_i64().unwrap(), vec![6]);
    }
}
