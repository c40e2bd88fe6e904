//! Splits one line of kernel text into tokens, with 1-based char columns.
//!
//! Words are identifiers that may contain `-` (`zero-point`, `matmul-w4a8`);
//! numbers start with a digit, sign or dot and run over the characters a
//! Rust float can contain (`-20.0`, `1e-7`, `-inf`). Everything after `#` is
//! a comment.

use super::ParseError;

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    Word(String),
    Num(String),
    Punct(char),
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Token {
    pub tok: Tok,
    pub col: usize,
}

impl Tok {
    /// How the token is quoted in an error message.
    pub fn describe(&self) -> String {
        match self {
            Tok::Word(w) | Tok::Num(w) => format!("'{w}'"),
            Tok::Punct(c) => format!("'{c}'"),
        }
    }
}

const PUNCT: &[char] = &['[', ']', '(', ')', ',', ':', '/', '=', '*'];

fn word_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

fn num_start(c: char) -> bool {
    c.is_ascii_digit() || matches!(c, '-' | '+' | '.')
}

fn num_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '+' | '.' | '_')
}

/// Tokenize one line (without its newline). `line_no` is for errors.
pub(crate) fn lex_line(line: &str, line_no: usize) -> Result<Vec<Token>, ParseError> {
    let chars: Vec<char> = line.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        let col = i + 1;
        if c == '#' {
            break;
        }
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let run = |pred: fn(char) -> bool, i: &mut usize| {
            let start = *i;
            while chars.get(*i).is_some_and(|&c| pred(c)) {
                *i += 1;
            }
            chars
                .get(start..*i)
                .unwrap_or_default()
                .iter()
                .collect::<String>()
        };
        let tok = if word_start(c) {
            Tok::Word(run(word_char, &mut i))
        } else if num_start(c) {
            Tok::Num(run(num_char, &mut i))
        } else if PUNCT.contains(&c) {
            i += 1;
            Tok::Punct(c)
        } else {
            return Err(ParseError {
                line: line_no,
                col,
                message: format!("unexpected character {c:?}"),
            });
        };
        toks.push(Token { tok, col });
    }
    Ok(toks)
}
