//! The bridge between the protobuf schema (text format, proto JSON) and [`ModelConfig`].

use std::sync::OnceLock;

use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, SerializeOptions};

use super::ModelConfig;
use crate::error::{Error, Result};

static POOL: OnceLock<MessageDescriptor> = OnceLock::new();

fn descriptor() -> &'static MessageDescriptor {
    POOL.get_or_init(|| {
        let pool = DescriptorPool::decode(
            &include_bytes!(concat!(env!("OUT_DIR"), "/model_config.bin"))[..],
        )
        .expect("the descriptor set compiled by build.rs decodes");
        pool.get_message_by_name("inference.ModelConfig")
            .expect("inference.ModelConfig is in the schema")
    })
}

fn to_json(msg: &DynamicMessage, defaults: bool) -> serde_json::Value {
    let opts = SerializeOptions::new()
        .use_proto_field_name(true)
        .stringify_64_bit_integers(false)
        .skip_default_fields(!defaults);
    msg.serialize_with_options(serde_json::value::Serializer, &opts)
        .expect("a dynamic message always serializes to JSON")
}

/// Parses protobuf text format into a [`ModelConfig`]; the error is a message with position.
pub(super) fn parse_text(text: &str) -> std::result::Result<ModelConfig, String> {
    let text = add_list_colons(text);
    let msg = DynamicMessage::parse_text_format(descriptor().clone(), &text)
        .map_err(|e| describe_parse_error(&text, &e))?;
    let mut cfg: ModelConfig = serde_json::from_value(to_json(&msg, false))
        .map_err(|e| format!("config does not fit the schema: {e}"))?;
    cfg.max_batch_size_set = sets_max_batch_size(&msg);
    Ok(cfg)
}

/// Whether the message sets `max_batch_size`, 0 included (the field is `optional`).
fn sets_max_batch_size(msg: &DynamicMessage) -> bool {
    msg.has_field_by_name("max_batch_size")
}

/// Inserts the optional `:` between a field name and a `[` list (`input [ { .. } ]`), which the
/// text-format grammar allows and every Triton config uses, but `prost-reflect` requires.
/// Strings and `#` comments are left untouched.
fn add_list_colons(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 16);
    let mut i = 0;
    let mut last = 0;
    while i < b.len() {
        match b[i] {
            b'"' | b'\'' => {
                let q = b[i];
                i += 1;
                while i < b.len() && b[i] != q && b[i] != b'\n' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.')
                {
                    i += 1;
                }
                let end = i;
                let mut j = i;
                loop {
                    while j < b.len() && b[j].is_ascii_whitespace() {
                        j += 1;
                    }
                    if j < b.len() && b[j] == b'#' {
                        while j < b.len() && b[j] != b'\n' {
                            j += 1;
                        }
                        continue;
                    }
                    break;
                }
                if j < b.len() && b[j] == b'[' {
                    out.push_str(&text[last..end]);
                    out.push(':');
                    last = end;
                }
            }
            _ => i += 1,
        }
    }
    out.push_str(&text[last.min(text.len())..]);
    out
}

fn describe_parse_error(text: &str, e: &prost_reflect::text_format::ParseError) -> String {
    // prost-reflect exposes the error's byte span only through `Debug` (or miette); read it from
    // there to point at line:column.
    let msg = e.to_string();
    let debug = format!("{e:?}");
    let offset = debug
        .split("span: ")
        .nth(1)
        .and_then(|s| s.split("..").next())
        .and_then(|s| s.parse::<usize>().ok());
    match offset {
        Some(offset) => {
            let offset = offset.min(text.len());
            let line = text[..offset].matches('\n').count() + 1;
            let col = offset - text[..offset].rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("config.pbtxt:{line}:{col}: {msg}")
        }
        None => format!("config.pbtxt: {msg}"),
    }
}

/// The Triton JSON form of a config, as `GET /v2/models/{m}/config` returns it: proto field
/// names, every field present (defaults included), 64-bit integers as numbers.
pub fn config_to_json(cfg: &ModelConfig) -> serde_json::Value {
    let value = serde_json::to_value(cfg).expect("ModelConfig serializes");
    match DynamicMessage::deserialize(descriptor().clone(), value.clone()) {
        Ok(msg) => to_json(&msg, true),
        // Cannot happen for a config that came from the schema; fall back to the plain form.
        Err(_) => value,
    }
}

/// The protobuf wire encoding of a config (`inference.ModelConfig`), for the gRPC front end.
pub fn config_to_protobuf(cfg: &ModelConfig) -> Vec<u8> {
    use prost::Message;
    let value = serde_json::to_value(cfg).expect("ModelConfig serializes");
    DynamicMessage::deserialize(descriptor().clone(), value)
        .map(|m| m.encode_to_vec())
        .unwrap_or_default()
}

/// Parses the Triton JSON form of a config (as in a repository `load` with a `config` override).
pub fn config_from_json(json: &str) -> Result<ModelConfig> {
    let mut de = serde_json::Deserializer::from_str(json);
    let msg = DynamicMessage::deserialize(descriptor().clone(), &mut de)
        .map_err(|e| Error::invalid(format!("invalid config JSON: {e}")))?;
    let mut cfg: ModelConfig = serde_json::from_value(to_json(&msg, false))
        .map_err(|e| Error::invalid(format!("config JSON does not fit the schema: {e}")))?;
    cfg.max_batch_size_set = sets_max_batch_size(&msg);
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::add_list_colons;

    #[test]
    fn list_colons() {
        assert_eq!(
            add_list_colons("input [ { dims: [1] } ]"),
            "input: [ { dims: [1] } ]"
        );
        assert_eq!(add_list_colons("a # c [\n [x]"), "a: # c [\n [x]");
        assert_eq!(add_list_colons("s: \"x [\" y: 1"), "s: \"x [\" y: 1");
        assert_eq!(add_list_colons("dims: [ 3 ]"), "dims: [ 3 ]");
    }
}
