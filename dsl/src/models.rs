//! Weight shapes of the models Tessera is tuned and built for.
//!
//! A decoder layer's matmuls are `y[M, N] = x[M, K] · W[N, K]ᵀ`; only their
//! `[N, K]` matters for kernels (M is the token count, known at run time).
//! The embedded table lists the common models; any other comes from its
//! Hugging Face `config.json` ([`ModelShapes::from_hf_config`]). Layers are:
//!
//! | layer | N | K |
//! |---|---|---|
//! | `qkv` (fused Q, K, V) | (heads + 2 · kv_heads) · head_dim | hidden |
//! | `o` | hidden | heads · head_dim |
//! | `gate_up` (fused gate and up) | 2 · intermediate | hidden |
//! | `down` | hidden | intermediate |
//! | `lm_head` (optional) | vocab | hidden |
//!
//! `lm_head` is listed apart: with a vocabulary of 150 000 it dominates
//! tuning time and runs once per token, so tools include it on request.

use std::fmt;

use serde_json::Value;

/// One weight matrix `[n, k]` and the layer(s) it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerShape {
    /// `qkv`, `o`, `gate_up`, `down`, `lm_head`; layers sharing a shape are
    /// joined with `+` by [`ModelShapes::distinct`].
    pub name: String,
    pub n: usize,
    pub k: usize,
}

/// The hyper-parameters that fix a decoder's weight shapes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelDims {
    pub hidden: usize,
    pub intermediate: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
}

/// A model's name and dimensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelShapes {
    pub name: String,
    pub dims: ModelDims,
}

/// Why a model cannot be described.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("unknown model `{name}`; embedded models: {}; or give a Hugging Face config.json path", EMBEDDED_NAMES.join(", "))]
    Unknown { name: String },
    #[error("cannot read model config {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("model config {path} is not valid JSON: {source}")]
    Json {
        path: String,
        source: serde_json::Error,
    },
    #[error("model config {path} has no `{field}` (looked for: {looked})")]
    Missing {
        path: String,
        field: &'static str,
        looked: String,
    },
    #[error("model config {path}: `{field}` {why}")]
    Invalid {
        path: String,
        field: String,
        why: String,
    },
}

/// Names of the embedded models, default first.
pub const EMBEDDED_NAMES: &[&str] = &[
    "qwen2-1.5b",
    "qwen2-7b",
    "llama2-7b",
    "chatglm2-6b",
    "gemma-2b",
];

/// The model tools tune when none is named.
pub const DEFAULT_MODEL: &str = "qwen2-1.5b";

fn dims(
    hidden: usize,
    intermediate: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
) -> ModelDims {
    ModelDims {
        hidden,
        intermediate,
        heads,
        kv_heads,
        head_dim,
        vocab,
    }
}

impl ModelShapes {
    /// An embedded model by name. `tiny` (not listed in errors) is a small
    /// test model whose shapes have tails for every tile.
    pub fn embedded(name: &str) -> Result<ModelShapes, ModelError> {
        // Values from each model's published config.json.
        let d = match name {
            "qwen2-1.5b" => dims(1536, 8960, 12, 2, 128, 151_936),
            "qwen2-7b" => dims(3584, 18944, 28, 4, 128, 152_064),
            "llama2-7b" => dims(4096, 11008, 32, 32, 128, 32_000),
            // ChatGLM2: ffn_hidden_size 13696, multi_query_group_num 2,
            // kv_channels 128, padded_vocab_size 65024.
            "chatglm2-6b" => dims(4096, 13696, 32, 2, 128, 65_024),
            "gemma-2b" => dims(2048, 16384, 8, 1, 256, 256_000),
            "tiny" => dims(200, 328, 5, 1, 40, 1000),
            _ => {
                return Err(ModelError::Unknown {
                    name: name.to_string(),
                });
            }
        };
        Ok(ModelShapes {
            name: name.to_string(),
            dims: d,
        })
    }

    /// `name` is an embedded model, else a path to a Hugging Face
    /// `config.json`.
    pub fn resolve(name_or_path: &str) -> Result<ModelShapes, ModelError> {
        match Self::embedded(name_or_path) {
            Ok(m) => Ok(m),
            Err(unknown) => {
                let path = std::path::Path::new(name_or_path);
                let looks_like_path = name_or_path.ends_with(".json")
                    || name_or_path.contains(std::path::MAIN_SEPARATOR)
                    || path.exists();
                if !looks_like_path {
                    return Err(unknown);
                }
                let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
                    path: name_or_path.to_string(),
                    source,
                })?;
                Self::from_hf_config(&text, name_or_path)
            }
        }
    }

    /// Read a Hugging Face `config.json` (text). `path` names the file in
    /// errors and, when the config has no `_name_or_path`, the model (its
    /// directory's name). ChatGLM's field names are accepted too.
    pub fn from_hf_config(text: &str, path: &str) -> Result<ModelShapes, ModelError> {
        let v: Value = serde_json::from_str(text).map_err(|source| ModelError::Json {
            path: path.to_string(),
            source,
        })?;
        // Some configs nest the language model (multimodal wrappers).
        let v = v.get("text_config").filter(|t| t.is_object()).unwrap_or(&v);
        if !v.is_object() {
            return Err(ModelError::Invalid {
                path: path.into(),
                field: "(top level)".into(),
                why: "must be a JSON object".into(),
            });
        }
        let field = |names: &[&str]| -> Result<Option<usize>, ModelError> {
            for name in names {
                match v.get(*name) {
                    None | Some(Value::Null) => continue,
                    Some(x) => {
                        let n =
                            x.as_u64()
                                .filter(|&n| n > 0)
                                .ok_or_else(|| ModelError::Invalid {
                                    path: path.into(),
                                    field: (*name).into(),
                                    why: format!("must be a positive integer, found {x}"),
                                })?;
                        let n = usize::try_from(n).map_err(|_| ModelError::Invalid {
                            path: path.into(),
                            field: (*name).into(),
                            why: "is too large".into(),
                        })?;
                        return Ok(Some(n));
                    }
                }
            }
            Ok(None)
        };
        let required = |what: &'static str, names: &[&str]| -> Result<usize, ModelError> {
            field(names)?.ok_or_else(|| ModelError::Missing {
                path: path.into(),
                field: what,
                looked: names.join(", "),
            })
        };
        let hidden = required("hidden_size", &["hidden_size", "n_embd", "d_model"])?;
        let intermediate = required(
            "intermediate_size",
            &["intermediate_size", "ffn_hidden_size", "n_inner"],
        )?;
        let heads = required(
            "num_attention_heads",
            &["num_attention_heads", "n_head", "num_heads"],
        )?;
        let kv_heads = field(&["num_key_value_heads", "multi_query_group_num"])?.unwrap_or(heads);
        let vocab = required("vocab_size", &["vocab_size", "padded_vocab_size"])?;
        let head_dim = match field(&["head_dim", "kv_channels"])? {
            Some(d) => d,
            None => {
                if hidden % heads != 0 {
                    return Err(ModelError::Invalid {
                        path: path.into(),
                        field: "hidden_size".into(),
                        why: format!(
                            "({hidden}) is not a multiple of num_attention_heads ({heads}) and there is no head_dim"
                        ),
                    });
                }
                hidden / heads
            }
        };
        if heads % kv_heads != 0 {
            return Err(ModelError::Invalid {
                path: path.into(),
                field: "num_key_value_heads".into(),
                why: format!("({kv_heads}) does not divide num_attention_heads ({heads})"),
            });
        }
        let name = v
            .get("_name_or_path")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(|s| s.rsplit('/').next().unwrap_or(s).to_string())
            .or_else(|| {
                std::path::Path::new(path)
                    .parent()
                    .and_then(|p| p.file_name())
                    .map(|s| s.to_string_lossy().into_owned())
                    .filter(|s| !s.is_empty())
            })
            .unwrap_or_else(|| "custom".to_string());
        Ok(ModelShapes {
            name,
            dims: dims(hidden, intermediate, heads, kv_heads, head_dim, vocab),
        })
    }

    /// The layer matmuls in the order of the module table; `lm_head` when
    /// asked.
    pub fn layers(&self, lm_head: bool) -> Vec<LayerShape> {
        let d = &self.dims;
        let shape = |name: &str, n: usize, k: usize| LayerShape {
            name: name.to_string(),
            n,
            k,
        };
        let mut v = vec![
            shape("qkv", (d.heads + 2 * d.kv_heads) * d.head_dim, d.hidden),
            shape("o", d.hidden, d.heads * d.head_dim),
            shape("gate_up", 2 * d.intermediate, d.hidden),
            shape("down", d.hidden, d.intermediate),
        ];
        if lm_head {
            v.push(shape("lm_head", d.vocab, d.hidden));
        }
        v
    }

    /// [`Self::layers`] with equal `[n, k]` merged (names joined by `+`),
    /// in first-seen order: what a tuner measures once.
    pub fn distinct(&self, lm_head: bool) -> Vec<LayerShape> {
        let mut out: Vec<LayerShape> = Vec::new();
        for l in self.layers(lm_head) {
            match out.iter_mut().find(|o| o.n == l.n && o.k == l.k) {
                Some(o) => {
                    o.name.push('+');
                    o.name.push_str(&l.name);
                }
                None => out.push(l),
            }
        }
        out
    }
}

impl fmt::Display for ModelShapes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = &self.dims;
        write!(
            f,
            "{} (hidden {}, intermediate {}, heads {}/{} kv, head_dim {}, vocab {})",
            self.name, d.hidden, d.intermediate, d.heads, d.kv_heads, d.head_dim, d.vocab
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nk(m: &ModelShapes) -> Vec<(String, usize, usize)> {
        m.layers(true)
            .into_iter()
            .map(|l| (l.name, l.n, l.k))
            .collect()
    }

    #[test]
    fn embedded_shapes_match_the_published_configs() {
        let q = ModelShapes::embedded("qwen2-1.5b").unwrap();
        let s = |n: &str, a: usize, b: usize| (n.to_string(), a, b);
        assert_eq!(
            nk(&q),
            vec![
                s("qkv", 2048, 1536),
                s("o", 1536, 1536),
                s("gate_up", 17920, 1536),
                s("down", 1536, 8960),
                s("lm_head", 151_936, 1536)
            ]
        );
        let l = ModelShapes::embedded("llama2-7b").unwrap();
        assert_eq!(nk(&l)[0], s("qkv", 12288, 4096));
        assert_eq!(nk(&l)[2], s("gate_up", 22016, 4096));
        let g = ModelShapes::embedded("chatglm2-6b").unwrap();
        assert_eq!(nk(&g)[0], s("qkv", 4608, 4096));
        let gm = ModelShapes::embedded("gemma-2b").unwrap();
        assert_eq!(nk(&gm)[0], s("qkv", 2560, 2048));
        assert_eq!(nk(&gm)[1], s("o", 2048, 2048));
        for name in EMBEDDED_NAMES {
            assert_eq!(ModelShapes::embedded(name).unwrap().name, *name);
        }
    }

    #[test]
    fn unknown_model_lists_the_embedded_ones() {
        let err = ModelShapes::resolve("qwen3").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("unknown model `qwen3`"), "{msg}");
        assert!(msg.contains("llama2-7b"), "{msg}");
        assert!(!msg.contains("tiny"), "{msg}");
    }

    #[test]
    fn hf_config_with_gqa_and_defaults() {
        let text = r#"{"_name_or_path": "Qwen/Qwen2-1.5B", "hidden_size": 1536,
            "intermediate_size": 8960, "num_attention_heads": 12,
            "num_key_value_heads": 2, "vocab_size": 151936, "head_dim": null}"#;
        let m = ModelShapes::from_hf_config(text, "x/config.json").unwrap();
        assert_eq!(m.name, "Qwen2-1.5B");
        assert_eq!(m.dims, ModelShapes::embedded("qwen2-1.5b").unwrap().dims);
        // No kv heads: multi-head attention; name from the directory.
        let text = r#"{"hidden_size": 64, "intermediate_size": 100,
            "num_attention_heads": 4, "vocab_size": 50}"#;
        let m = ModelShapes::from_hf_config(text, "models/mini/config.json").unwrap();
        assert_eq!(m.name, "mini");
        assert_eq!((m.dims.kv_heads, m.dims.head_dim), (4, 16));
        // An explicit head_dim wins (Gemma).
        let text = r#"{"text_config": {"hidden_size": 2048, "intermediate_size": 16384,
            "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
            "vocab_size": 256000}}"#;
        let m = ModelShapes::from_hf_config(text, "config.json").unwrap();
        assert_eq!(m.dims, ModelShapes::embedded("gemma-2b").unwrap().dims);
        assert_eq!(m.name, "custom");
        // ChatGLM's names.
        let text = r#"{"hidden_size": 4096, "ffn_hidden_size": 13696, "num_attention_heads": 32,
            "multi_query_group_num": 2, "kv_channels": 128, "padded_vocab_size": 65024}"#;
        let m = ModelShapes::from_hf_config(text, "config.json").unwrap();
        assert_eq!(m.dims, ModelShapes::embedded("chatglm2-6b").unwrap().dims);
    }

    #[test]
    fn malformed_configs_name_the_problem() {
        let err = |text: &str| {
            ModelShapes::from_hf_config(text, "c.json")
                .unwrap_err()
                .to_string()
        };
        assert!(err("{").contains("not valid JSON"));
        assert!(err("[1, 2]").contains("must be a JSON object"));
        let e = err(r#"{"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 5}"#);
        assert!(e.contains("no `intermediate_size`"), "{e}");
        let e = err(
            r#"{"hidden_size": "64", "intermediate_size": 1, "num_attention_heads": 4, "vocab_size": 5}"#,
        );
        assert!(
            e.contains("`hidden_size` must be a positive integer"),
            "{e}"
        );
        let e = err(
            r#"{"hidden_size": 0, "intermediate_size": 1, "num_attention_heads": 4, "vocab_size": 5}"#,
        );
        assert!(e.contains("positive integer"), "{e}");
        let e = err(
            r#"{"hidden_size": 66, "intermediate_size": 1, "num_attention_heads": 4, "vocab_size": 5}"#,
        );
        assert!(e.contains("not a multiple"), "{e}");
        let e = err(
            r#"{"hidden_size": 64, "intermediate_size": 1, "num_attention_heads": 4, "num_key_value_heads": 3, "vocab_size": 5}"#,
        );
        assert!(e.contains("does not divide"), "{e}");
        let missing = ModelShapes::resolve("/nonexistent/config.json").unwrap_err();
        assert!(
            missing.to_string().contains("cannot read model config"),
            "{missing}"
        );
    }

    #[test]
    fn distinct_merges_equal_shapes() {
        let m = ModelShapes {
            name: "sq".into(),
            dims: dims(64, 32, 1, 1, 64, 10),
        };
        // qkv [192, 64], o [64, 64], gate_up [64, 64], down [64, 32].
        let d = m.distinct(false);
        let names: Vec<&str> = d.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, vec!["qkv", "o+gate_up", "down"]);
    }
}
