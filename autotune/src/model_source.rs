//! What `--model` names, as the shapes to tune and, for a model file, the
//! format each is stored in:
//!
//! - an embedded model or a Hugging Face `config.json`
//!   (`tessera_dsl::models`): the decoder's shapes, in the format
//!   `--format` (or the backend's default) gives them all;
//! - a `.gguf` file: the shapes its metadata fixes
//!   (`{arch}.embedding_length`, `.feed_forward_length`,
//!   `.attention.head_count`, `.attention.head_count_kv`,
//!   `.attention.key_length`, `.block_count`), each checked against the
//!   tensors `blk.N.*` of every block, in the format of those tensors' ggml
//!   type (Q4_0 → q4_0, Q4_1 → q4_1, Q8_0 → q8_0, F16 → f16, F32 and BF16 →
//!   f32, Q4_K → q4_1, Q6_K → q8_0: what the runtime loads them into).
//!   Q, K and V fuse into `qkv` (gate and up into `gate_up`) when they share
//!   a type, as an engine would fuse them; otherwise each is its own shape.
//!   A shape whose type differs between blocks is tuned in each format;
//! - a shape list (`{"tessera_shapes": 1, …}`): what `--remote` ships
//!   instead of a GGUF file, which may be gigabytes.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tessera_dsl::models::{ModelError, ModelShapes};
use tessera_runtime::model_file::{
    GgmlType, GgufHeader, Location, ModelFile, ModelFileError, weight_format_for,
};

use crate::tune::ShapeSpec;

/// One weight shape to tune.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanShape {
    pub name: String,
    pub n: usize,
    pub k: usize,
    /// The runtime format the file stores it in (None: `--format` or the
    /// backend's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// Tuned only with `--lm-head`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lm_head: bool,
}

/// A model's name and every shape `--model` names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunePlan {
    /// The record's `model`.
    pub name: String,
    pub shapes: Vec<PlanShape>,
    /// The attention's heads, where the source names them (embedded models,
    /// config.json, GGUF; a shape list only if it carries them): the
    /// prefill blocks are tuned for them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention: Option<AttentionHeads>,
}

/// Query heads, KV heads and head dim of a model's attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttentionHeads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// The version of the shape-list file this build writes and reads.
pub const SHAPE_LIST_VERSION: u64 = 1;

#[derive(Serialize, Deserialize)]
struct ShapeList {
    tessera_shapes: u64,
    #[serde(flatten)]
    plan: TunePlan,
}

/// Why `--model` cannot be tuned.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{0}")]
    Model(#[from] ModelError),
    #[error("{0}")]
    File(#[from] ModelFileError),
    #[error("shape list {path}: {why}")]
    ShapeList { path: String, why: String },
}

impl TunePlan {
    /// An embedded model, a config.json, a .gguf file or a shape list.
    pub fn resolve(model: &str) -> Result<TunePlan, SourceError> {
        let path = Path::new(model);
        if path.is_file() {
            let head = read_head(path);
            if head.starts_with(b"GGUF") || model.ends_with(".gguf") {
                return Self::from_gguf(&ModelFile::open(path)?);
            }
            if model.ends_with(".json")
                && let Ok(text) = std::fs::read_to_string(path)
                && text.contains("\"tessera_shapes\"")
            {
                return Self::from_shape_list(&text, model);
            }
        }
        Ok(Self::from_model(&ModelShapes::resolve(model)?))
    }

    /// The decoder's shapes, no formats.
    pub fn from_model(m: &ModelShapes) -> TunePlan {
        let shapes = m
            .layers(true)
            .into_iter()
            .map(|l| PlanShape {
                lm_head: l.name == "lm_head",
                name: l.name,
                n: l.n,
                k: l.k,
                format: None,
            })
            .collect();
        TunePlan {
            name: m.name.clone(),
            shapes,
            attention: Some(AttentionHeads {
                heads: m.dims.heads,
                kv_heads: m.dims.kv_heads,
                head_dim: m.dims.head_dim,
            }),
        }
    }

    pub fn from_shape_list(text: &str, path: &str) -> Result<TunePlan, SourceError> {
        let err = |why: String| SourceError::ShapeList {
            path: path.to_string(),
            why,
        };
        let list: ShapeList = serde_json::from_str(text).map_err(|e| err(e.to_string()))?;
        if list.tessera_shapes != SHAPE_LIST_VERSION {
            return Err(err(format!(
                "version {} (this build reads {SHAPE_LIST_VERSION})",
                list.tessera_shapes
            )));
        }
        if let Some(s) = list.plan.shapes.iter().find(|s| s.n == 0 || s.k == 0) {
            return Err(err(format!("shape `{}` has a zero dimension", s.name)));
        }
        Ok(list.plan)
    }

    /// The shape list `--remote` ships for this plan.
    pub fn to_shape_list(&self) -> String {
        serde_json::to_string_pretty(&ShapeList {
            tessera_shapes: SHAPE_LIST_VERSION,
            plan: self.clone(),
        })
        .expect("a plan serializes")
    }

    /// The shapes a GGUF file's metadata fixes, in its tensors' formats.
    pub fn from_gguf(file: &ModelFile) -> Result<TunePlan, SourceError> {
        let h = file.gguf().ok_or_else(|| ModelFileError::Format {
            path: file.path().to_string(),
            at: Location::Header,
            field: "magic".into(),
            why: "not a GGUF file".into(),
        })?;
        let meta = Meta { file, h };
        let arch = meta.string("general.architecture")?;
        let key = |k: &str| format!("{arch}.{k}");
        let blocks = meta.count(&key("block_count"))?;
        let hidden = meta.count(&key("embedding_length"))?;
        let ff = meta.count(&key("feed_forward_length"))?;
        let heads = meta.count(&key("attention.head_count"))?;
        let kv_heads = match h.meta(&key("attention.head_count_kv")) {
            Some(_) => meta.count(&key("attention.head_count_kv"))?,
            None => heads,
        };
        let head_dim = match h.meta(&key("attention.key_length")) {
            Some(_) => meta.count(&key("attention.key_length"))?,
            None => {
                if hidden % heads != 0 {
                    return Err(meta
                        .err(
                            &key("embedding_length"),
                            format!("{hidden} is not a multiple of the head count {heads}"),
                        )
                        .into());
                }
                hidden / heads
            }
        };
        if heads % kv_heads != 0 {
            return Err(meta
                .err(
                    &key("attention.head_count_kv"),
                    format!("{kv_heads} does not divide the head count {heads}"),
                )
                .into());
        }
        let (q_rows, kv_rows) = (heads * head_dim, kv_heads * head_dim);
        let mut shapes: Vec<PlanShape> = Vec::new();
        let mut push = |name: &str, n: usize, k: usize, format: String, lm_head: bool| {
            let s = PlanShape {
                name: name.to_string(),
                n,
                k,
                format: Some(format),
                lm_head,
            };
            if !shapes.contains(&s) {
                shapes.push(s);
            }
        };
        for b in 0..blocks {
            let t = |part: &str| format!("blk.{b}.{part}.weight");
            // Fused QKV in the file, or Q, K, V fused here when they share a type.
            if h.tensor(&t("attn_qkv")).is_some() {
                let f = meta.format_of(&t("attn_qkv"), q_rows + 2 * kv_rows, hidden)?;
                push("qkv", q_rows + 2 * kv_rows, hidden, f, false);
            } else {
                let q = meta.format_of(&t("attn_q"), q_rows, hidden)?;
                let k = meta.format_of(&t("attn_k"), kv_rows, hidden)?;
                let v = meta.format_of(&t("attn_v"), kv_rows, hidden)?;
                if q == k && k == v {
                    push("qkv", q_rows + 2 * kv_rows, hidden, q, false);
                } else {
                    push("q", q_rows, hidden, q, false);
                    push("k", kv_rows, hidden, k, false);
                    push("v", kv_rows, hidden, v, false);
                }
            }
            let o = meta.format_of(&t("attn_output"), hidden, q_rows)?;
            push("o", hidden, q_rows, o, false);
            let up = meta.format_of(&t("ffn_up"), ff, hidden)?;
            match h.tensor(&t("ffn_gate")) {
                Some(_) => {
                    let gate = meta.format_of(&t("ffn_gate"), ff, hidden)?;
                    if gate == up {
                        push("gate_up", 2 * ff, hidden, up, false);
                    } else {
                        push("gate", ff, hidden, gate, false);
                        push("up", ff, hidden, up, false);
                    }
                }
                None => push("up", ff, hidden, up, false),
            }
            let down = meta.format_of(&t("ffn_down"), hidden, ff)?;
            push("down", hidden, ff, down, false);
        }
        // lm_head: `output.weight`, or the tied token embedding.
        let head = ["output.weight", "token_embd.weight"]
            .into_iter()
            .find(|n| h.tensor(n).is_some());
        if let Some(name) = head {
            let vocab = h.tensor(name).and_then(|t| t.shape().first().copied());
            if let Some(vocab) = vocab {
                let f = meta.format_of(name, vocab, hidden)?;
                push("lm_head", vocab, hidden, f, true);
            }
        }
        let name = h
            .meta("general.name")
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .unwrap_or_else(|| {
                Path::new(file.path())
                    .file_stem()
                    .map_or("gguf".into(), |s| s.to_string_lossy().into_owned())
            });
        Ok(TunePlan {
            name,
            shapes,
            attention: Some(AttentionHeads {
                heads,
                kv_heads,
                head_dim,
            }),
        })
    }

    /// The shapes to tune, grouped by format in first-seen order: every
    /// shape in `forced` when given, else in its own format, else in
    /// `default`; equal `[n, k]` in one format merged (names joined by `+`).
    pub fn groups(
        &self,
        lm_head: bool,
        forced: Option<&str>,
        default: &str,
    ) -> Vec<(String, Vec<ShapeSpec>)> {
        let mut out: Vec<(String, Vec<ShapeSpec>)> = Vec::new();
        for s in self.shapes.iter().filter(|s| lm_head || !s.lm_head) {
            let format = forced
                .or(s.format.as_deref())
                .unwrap_or(default)
                .to_string();
            let group = match out.iter().position(|(f, _)| *f == format) {
                Some(i) => &mut out[i].1,
                None => {
                    out.push((format, Vec::new()));
                    &mut out.last_mut().expect("just pushed").1
                }
            };
            match group.iter_mut().find(|g| g.n == s.n && g.k == s.k) {
                Some(g) => {
                    if !g.name.split('+').any(|n| n == s.name) {
                        g.name.push('+');
                        g.name.push_str(&s.name);
                    }
                }
                None => group.push(ShapeSpec {
                    name: s.name.clone(),
                    n: s.n,
                    k: s.k,
                }),
            }
        }
        out
    }

    /// Whether the plan carries its own formats (a model file).
    pub fn has_formats(&self) -> bool {
        self.shapes.iter().any(|s| s.format.is_some())
    }
}

/// The first bytes of a file (empty when it cannot be read).
fn read_head(path: &Path) -> Vec<u8> {
    use std::io::Read;
    let mut head = Vec::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(4).read_to_end(&mut head);
    }
    head
}

/// Metadata look-ups with errors naming the file and key.
struct Meta<'a> {
    file: &'a ModelFile,
    h: &'a GgufHeader,
}

impl Meta<'_> {
    fn err(&self, key: &str, why: String) -> ModelFileError {
        ModelFileError::Format {
            path: self.file.path().to_string(),
            at: Location::Metadata(key.to_string()),
            field: "value".into(),
            why,
        }
    }

    fn missing(&self, key: &str) -> ModelFileError {
        self.err(key, "is missing (needed for the model's shapes)".into())
    }

    fn string(&self, key: &str) -> Result<String, ModelFileError> {
        let v = self.h.meta(key).ok_or_else(|| self.missing(key))?;
        v.as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .ok_or_else(|| self.err(key, format!("must be a non-empty string, found {v:?}")))
    }

    /// A positive integer that fits usize and is not absurd for a model
    /// dimension (at most 2^31).
    fn count(&self, key: &str) -> Result<usize, ModelFileError> {
        let v = self.h.meta(key).ok_or_else(|| self.missing(key))?;
        v.as_u64()
            .filter(|&n| n > 0 && n <= 1 << 31)
            .map(|n| n as usize)
            .ok_or_else(|| {
                self.err(
                    key,
                    format!(
                        "must be a positive integer of at most 2^31, found {} {v:?}",
                        v.type_name()
                    ),
                )
            })
    }

    /// The runtime format of tensor `name`, after checking its shape is
    /// the `[n, k]` the metadata implies.
    fn format_of(&self, name: &str, n: usize, k: usize) -> Result<String, ModelFileError> {
        let t = self
            .h
            .tensor(name)
            .ok_or_else(|| ModelFileError::NoTensor {
                path: self.file.path().to_string(),
                tensor: name.to_string(),
            })?;
        if t.shape() != [n, k] {
            return Err(ModelFileError::Tensor {
                path: self.file.path().to_string(),
                tensor: name.to_string(),
                why: format!(
                    "has shape {:?}; the metadata's dimensions make it [{n}, {k}]",
                    t.shape()
                ),
            });
        }
        format_name(t.dtype).ok_or_else(|| ModelFileError::UnsupportedType {
            path: self.file.path().to_string(),
            tensor: name.to_string(),
            dtype: t.dtype.name().to_string(),
            supported: tessera_runtime::model_file::ggml_type::supported_names(),
        })
    }
}

/// The runtime format a ggml type is tuned (and loaded) in.
pub fn format_name(dtype: GgmlType) -> Option<String> {
    weight_format_for(dtype).map(|f| f.name().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(name: &str, n: usize, k: usize, format: Option<&str>) -> PlanShape {
        PlanShape {
            name: name.into(),
            n,
            k,
            format: format.map(Into::into),
            lm_head: false,
        }
    }

    #[test]
    fn groups_follow_formats_and_merge_equal_shapes() {
        let plan = TunePlan {
            name: "m".into(),
            attention: None,
            shapes: vec![
                shape("qkv", 512, 256, Some("q4_0")),
                shape("o", 256, 256, Some("q8_0")),
                shape("gate_up", 512, 256, Some("q4_1")),
                shape("down", 256, 256, Some("q8_0")),
                shape("down", 256, 256, Some("q4_1")),
                PlanShape {
                    lm_head: true,
                    ..shape("lm_head", 1000, 256, Some("q8_0"))
                },
            ],
        };
        let g = plan.groups(false, None, "w4a8");
        type Shapes = Vec<(String, usize, usize)>;
        let view: Vec<(String, Shapes)> = g
            .iter()
            .map(|(f, s)| {
                (
                    f.clone(),
                    s.iter().map(|s| (s.name.clone(), s.n, s.k)).collect(),
                )
            })
            .collect();
        assert_eq!(
            view,
            vec![
                ("q4_0".into(), vec![("qkv".into(), 512, 256)]),
                ("q8_0".into(), vec![("o+down".into(), 256, 256)]),
                (
                    "q4_1".into(),
                    vec![("gate_up".into(), 512, 256), ("down".into(), 256, 256)]
                ),
            ]
        );
        assert_eq!(plan.groups(true, None, "w4a8")[1].1.len(), 2);
        let forced = plan.groups(false, Some("f32"), "w4a8");
        assert_eq!(forced.len(), 1);
        assert_eq!(forced[0].1.len(), 2, "{forced:?}");
        let list = plan.to_shape_list();
        assert_eq!(TunePlan::from_shape_list(&list, "x.json").unwrap(), plan);
        let bad = list.replace("\"tessera_shapes\": 1", "\"tessera_shapes\": 9");
        assert!(TunePlan::from_shape_list(&bad, "x.json").is_err());
    }

    #[test]
    fn embedded_models_keep_their_shapes_without_formats() {
        let m = ModelShapes::embedded("tiny").unwrap();
        let plan = TunePlan::from_model(&m);
        assert!(!plan.has_formats());
        let groups = plan.groups(false, None, "q4_0");
        assert_eq!(groups.len(), 1);
        let want: Vec<(usize, usize)> = m.distinct(false).iter().map(|l| (l.n, l.k)).collect();
        let got: Vec<(usize, usize)> = groups[0].1.iter().map(|s| (s.n, s.k)).collect();
        assert_eq!(got, want);
        assert_eq!(plan.groups(true, None, "q4_0")[0].1.len(), want.len() + 1);
    }
}
