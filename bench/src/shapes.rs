//! Weight shapes [N, K] to benchmark: model presets and `N,K;N,K` lists.

use crate::error::BenchError;
use serde::{Deserialize, Serialize};

/// One linear layer: weights `[n, k]` row-major, computed as `y = x·Wᵀ`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    /// Where the shape comes from, e.g. `llama2-7b ffn_up`.
    pub label: String,
    pub n: usize,
    pub k: usize,
}

impl Shape {
    pub fn new(label: impl Into<String>, n: usize, k: usize) -> Self {
        Shape {
            label: label.into(),
            n,
            k,
        }
    }
}

/// Llama2-7B: hidden 4096, intermediate 11008, fused qkv 3·4096.
pub fn llama2_7b() -> Vec<Shape> {
    vec![
        Shape::new("llama2-7b attn_o", 4096, 4096),
        Shape::new("llama2-7b ffn_up", 11008, 4096),
        Shape::new("llama2-7b ffn_down", 4096, 11008),
        Shape::new("llama2-7b attn_qkv", 12288, 4096),
    ]
}

/// Qwen2-1.5B: hidden 1536, intermediate 8960, 12 heads and 2 KV heads of 128.
pub fn qwen2_1_5b() -> Vec<Shape> {
    vec![
        Shape::new("qwen2-1.5b attn_qkv", 1536 + 2 * 2 * 128, 1536),
        Shape::new("qwen2-1.5b attn_o", 1536, 1536),
        Shape::new("qwen2-1.5b ffn_gate_up", 2 * 8960, 1536),
        Shape::new("qwen2-1.5b ffn_down", 1536, 8960),
    ]
}

/// Parses `llama2-7b`, `qwen2-1.5b`, or `N,K[;N,K...]`; presets and custom
/// shapes may be mixed with `;`.
pub fn parse_shapes(text: &str) -> Result<Vec<Shape>, BenchError> {
    let bad = |why: &str| BenchError::Shape {
        text: text.to_string(),
        why: why.to_string(),
    };
    let mut shapes = Vec::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        match part {
            "llama2-7b" => shapes.extend(llama2_7b()),
            "qwen2-1.5b" => shapes.extend(qwen2_1_5b()),
            _ => {
                let (n, k) = part
                    .split_once(',')
                    .ok_or_else(|| bad(&format!("{part:?} is neither a preset nor N,K")))?;
                let n: usize = n
                    .trim()
                    .parse()
                    .map_err(|_| bad(&format!("N in {part:?} is not a number")))?;
                let k: usize = k
                    .trim()
                    .parse()
                    .map_err(|_| bad(&format!("K in {part:?} is not a number")))?;
                if n == 0 || k == 0 {
                    return Err(bad("N and K must be positive"));
                }
                shapes.push(Shape::new("custom", n, k));
            }
        }
    }
    if shapes.is_empty() {
        return Err(bad("no shape given"));
    }
    Ok(shapes)
}

/// Parses `1,2,4` into positive integers.
pub fn parse_list(text: &str) -> Result<Vec<usize>, BenchError> {
    let bad = |why: String| BenchError::List {
        text: text.to_string(),
        why,
    };
    let values = text
        .split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| match v.parse::<usize>() {
            Ok(0) => Err(bad("0 is not allowed".into())),
            Ok(x) => Ok(x),
            Err(_) => Err(bad(format!("{v:?} is not a number"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if values.is_empty() {
        return Err(bad("empty".into()));
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_have_the_model_shapes() {
        let l: Vec<_> = llama2_7b().iter().map(|s| (s.n, s.k)).collect();
        assert_eq!(
            l,
            [(4096, 4096), (11008, 4096), (4096, 11008), (12288, 4096)]
        );
        let q: Vec<_> = qwen2_1_5b().iter().map(|s| (s.n, s.k)).collect();
        assert_eq!(q, [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)]);
    }

    #[test]
    fn mixed_presets_and_custom_shapes() {
        let s = parse_shapes("qwen2-1.5b; 100,37").unwrap();
        assert_eq!(s.len(), 5);
        assert_eq!(s[4], Shape::new("custom", 100, 37));
    }

    #[test]
    fn bad_shapes_are_named() {
        for bad in ["", "llama", "4096", "0,5", "a,5", "5,b"] {
            let err = parse_shapes(bad).unwrap_err().to_string();
            assert!(err.contains("bad shape"), "{bad}: {err}");
        }
    }

    #[test]
    fn lists() {
        assert_eq!(parse_list("1, 2,8").unwrap(), [1, 2, 8]);
        assert!(parse_list("1,0").is_err());
        assert!(parse_list("x").is_err());
        assert!(parse_list("").is_err());
    }
}
