//! Parse errors name the line (and column) and the problem; verify errors
//! found while parsing point at the offending declaration.

use tessera_dsl::text::{ParseError, parse_unverified};
use tessera_dsl::*;

const GOOD: &str = "kernel matmul-w4a8
axis e: dyn
axis h: dyn
axis l: dyn reduce
tile hp of h: solve
tile lp of l: 32
input x[e, l]: i8dyn
weight w[h, l]: u4asym:g32 layout [h/hp, l/lp, hp, lp] pair-transpose
input b[h]: f32
output y[e, h]: f32
matmul y[e, h] = x[e, l] * w[h, l] epilogue scale zero-point bias(b) act(none)
parallel h
";

/// `GOOD` with line `line` (1-based) replaced.
fn with_line(line: usize, text: &str) -> String {
    GOOD.lines()
        .enumerate()
        .map(|(i, l)| if i + 1 == line { text } else { l })
        .collect::<Vec<_>>()
        .join("\n")
}

fn err(text: &str) -> ParseError {
    match text.parse::<Kernel>() {
        Ok(k) => panic!("parsed unexpectedly:\n{k}"),
        Err(e) => e,
    }
}

/// The error is on `line` and its message contains every one of `parts`.
fn expect(text: &str, line: usize, parts: &[&str]) -> ParseError {
    let e = err(text);
    assert_eq!(e.line, line, "{e}");
    let shown = e.to_string();
    assert!(shown.starts_with(&format!("line {line}: ")), "{shown}");
    for p in parts {
        assert!(shown.contains(p), "{shown:?} does not mention {p:?}");
    }
    e
}

#[test]
fn good_text_parses() {
    let k: Kernel = GOOD.parse().unwrap();
    assert_eq!(k.to_string(), GOOD);
}

#[test]
fn unknown_format() {
    let e = expect(
        &with_line(9, "input b[h]: u5asym:g32"),
        9,
        &["unknown format 'u5asym'", "expected one of f32, f16"],
    );
    assert_eq!(e.col, 13);
    expect(
        &with_line(9, "input b[h]: f32:g32"),
        9,
        &["'f32' takes no group"],
    );
    expect(
        &with_line(8, "weight w[h, l]: u4asym"),
        8,
        &["needs a group"],
    );
    expect(
        &with_line(8, "weight w[h, l]: u4asym:g"),
        8,
        &["unknown group 'g'"],
    );
}

#[test]
fn double_buffer_is_refused_with_its_reason() {
    expect(
        &with_line(3, "double-buffer l"),
        3,
        &["'double-buffer' is not a schedule statement", "remove it"],
    );
}

#[test]
fn unknown_keyword() {
    let e = expect(
        &with_line(3, "axes h: dyn"),
        3,
        &["unknown keyword 'axes'", "expected one of"],
    );
    assert_eq!(e.col, 1);
    expect(
        &with_line(5, "  [tile hp of h: solve"),
        5,
        &["expected a keyword but found '['"],
    );
}

#[test]
fn missing_bracket() {
    let e = expect(
        &with_line(7, "input x[e, l: i8dyn"),
        7,
        &["expected ',' or ']' but found ':'"],
    );
    assert_eq!(e.col, 13);
    expect(&with_line(7, "input x e, l]: i8dyn"), 7, &["expected '['"]);
    expect(
        &with_line(8, "weight w[h, l]: u4asym:g32 layout [h/hp, l/lp, hp, lp"),
        8,
        &["expected ',' or ']' but found end of line"],
    );
    expect(
        &with_line(
            11,
            "matmul y[e, h] = x[e, l] * w[h, l] epilogue bias(b act(none)",
        ),
        11,
        &["expected ')' but found 'act'"],
    );
}

#[test]
fn trailing_garbage() {
    let e = expect(
        &with_line(2, "axis e: dyn spatial reduce"),
        2,
        &["unexpected 'reduce' after the end"],
    );
    assert_eq!(e.col, 21);
    expect(&with_line(12, "parallel h e"), 12, &["unexpected 'e'"]);
    expect(&with_line(1, "kernel a b"), 1, &["unexpected 'b'"]);
}

#[test]
fn other_syntax_errors() {
    expect(&with_line(2, "axis e: -3"), 2, &["expected an extent"]);
    expect(&with_line(2, "axis e: 99999999999"), 2, &["too large"]);
    expect(
        &with_line(5, "tile hp on h: solve"),
        5,
        &["expected 'of' but found 'on'"],
    );
    expect(
        &with_line(2, "axis e: dyn ; x"),
        2,
        &["unexpected character ';'"],
    );
    expect(
        &with_line(
            11,
            "matmul y[e, h] = x[l, e] * w[h, l] epilogue scale zero-point",
        ),
        11,
        &["index 'l' should be 'e'"],
    );
    expect(
        &with_line(
            11,
            "matmul y[e, h] = x[e, l] * w[h, l] epilogue scale scale",
        ),
        11,
        &["duplicate epilogue item 'scale'"],
    );
    expect(
        &with_line(11, "matmul y[e, h] = x[e, l] * w[h, l] epilogue act(gelu)"),
        11,
        &["unknown activation 'gelu'"],
    );
    expect(
        &format!("{GOOD}matmul y[e, h] = x[e, l] * w[h, l]\n"),
        13,
        &["duplicate operation (first on line 11)"],
    );
    expect(
        &format!("{GOOD}parallel e\n"),
        13,
        &["duplicate 'parallel' line"],
    );
    expect(
        "axis e: dyn\nkernel k\n",
        1,
        &["expected 'kernel NAME' before 'axis'"],
    );
    expect("", 1, &["no 'kernel NAME'"]);
    expect("# nothing\n\n", 2, &["no 'kernel NAME'"]);
    expect("kernel k\naxis e: dyn\n", 1, &["has no operation"]);
}

#[test]
fn attention_syntax_errors() {
    let good = "kernel a
axis t: 1
axis hq: 32
axis kvh: 8
axis d: 64
axis s: dyn reduce
input q[t, hq, d]: f16
cache k[s, kvh, d]: i8asym:row
cache v[s, kvh, d]: fp8e4m3
output o[t, hq, d]: f32
attention decode o[t, hq, d] = softmax(q[t, hq, d] * k[s, kvh, d]) * v[s, kvh, d] softmax async(phi=1.5, lo=-inf, hi=2.5e1)
";
    let k: Kernel = good.parse().unwrap();
    assert_eq!(
        k.as_attention().unwrap().softmax,
        SoftmaxMode::Async {
            phi: 1.5,
            lo: f32::NEG_INFINITY,
            hi: 25.0
        }
    );
    let line11 = |l: &str| {
        good.lines()
            .take(10)
            .chain([l])
            .collect::<Vec<_>>()
            .join("\n")
    };
    expect(
        &line11(
            "attention decode o[t, hq, d] = softmax(q[t, hq, d] * k[s, kvh, d]) * v[s, kvh, d]",
        ),
        11,
        &["expected 'softmax online' or 'softmax async(...)'"],
    );
    expect(
        &line11(
            "attention decoding o[t, hq, d] = softmax(q[t, hq, d] * k[s, kvh, d]) * v[s, kvh, d] softmax online",
        ),
        11,
        &["unknown attention kind 'decoding'"],
    );
    expect(
        &line11(
            "attention decode o[t, hq, d] = softmax(q[t, hq, d] * k[s, kvh, d] * v[s, kvh, d] softmax online",
        ),
        11,
        &["expected ')' but found '*'"],
    );
    expect(
        &line11(
            "attention decode o[t, hq, d] = softmax(q[t, hq] * k[s, kvh, d]) * v[s, kvh, d] softmax online",
        ),
        11,
        &["needs 3 indices, found 2"],
    );
    expect(
        &line11(
            "attention decode o[t, hq, d] = softmax(q[t, hq, d] * k[s, kvh, d]) * v[s, kvh, d] softmax async(phi=x1, lo=0, hi=1)",
        ),
        11,
        &["'x1' is not a number"],
    );
    expect(
        &line11(
            "attention decode o[t, hq, d] = softmax(q[t, hq, d] * k[s, kvh, d]) * v[s, kvh, d] softmax async(phi=0, hi=1, lo=0)",
        ),
        11,
        &["expected 'lo' but found 'hi'"],
    );
    expect(
        &line11(
            "attention decode o[t, hq, d] = softmax(q[t, hq, d] * k[s, kvh, d]) * v[s, kvh, d] softmax online softmax online",
        ),
        11,
        &["duplicate 'softmax'"],
    );
    // A verify error: decode with 4 tokens points at the axis line.
    let text = good.replace("axis t: 1", "axis t: 4");
    expect(&text, 2, &["decode attention needs tokens axis 't'"]);
    // Async softmax with lo >= hi points at the op line.
    let text = good.replace("lo=-inf", "lo=30");
    expect(&text, 11, &["lo < hi"]);
}

#[test]
fn verify_errors_point_at_the_declaration() {
    // Unknown axis in a tensor: the tensor's line, column of its name.
    let e = expect(
        &with_line(9, "input b[q]: f32"),
        9,
        &["tensor 'b' refers to unknown axis 'q'"],
    );
    assert_eq!(e.col, 7);
    // Duplicate axis: the second declaration.
    expect(
        &with_line(4, "axis h: 8 reduce"),
        4,
        &["duplicate axis name 'h'"],
    );
    // Missing scale: the op line.
    expect(
        &with_line(
            11,
            "matmul y[e, h] = x[e, l] * w[h, l] epilogue zero-point bias(b)",
        ),
        11,
        &["tensor 'x' has quantized format i8dyn but the epilogue has no scale"],
    );
    // Pair-transpose on an 8-bit format: the tensor's line.
    expect(
        &with_line(
            8,
            "weight w[h, l]: i8asym:g32 layout [h/hp, l/lp, hp, lp] pair-transpose",
        ),
        8,
        &["pair-transpose needs a 4-bit format, not i8asym:g32"],
    );
    // A bare tile name without its outer part.
    expect(
        &with_line(8, "weight w[h, l]: u4asym:g32 layout [h, l, lp]"),
        8,
        &["inner tile 'lp'"],
    );
    // Zero tile.
    expect(
        &with_line(6, "tile lp of l: 0"),
        6,
        &["tile 'lp' has size 0"],
    );
    // Split on a spatial axis.
    expect(
        &format!("{GOOD}split h\n"),
        13,
        &["split axis 'h' must be a reduce axis"],
    );
    // Invalid name with '-' (the lexer allows it in words; verify rejects it).
    expect(
        &with_line(9, "input b-x[h]: f32"),
        9,
        &["invalid tensor name 'b-x'"],
    );
    // parse_unverified accepts what verify would reject.
    let k = parse_unverified(&with_line(6, "tile lp of l: 0")).unwrap();
    assert_eq!(verify(&k), Err(VerifyError::ZeroTile { tile: "lp".into() }));
}

#[test]
fn columns_count_chars_not_bytes() {
    let e = err("kernel k\n# é\naxis é: dyn\n");
    assert_eq!((e.line, e.col), (3, 6), "{e}");
    assert!(e.message.contains("unexpected character 'é'"));
}
