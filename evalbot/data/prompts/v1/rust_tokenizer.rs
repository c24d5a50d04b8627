//! A small tokenizer for arithmetic expressions with variables and function calls.
//!
//! It works on bytes for speed but reports positions as character offsets, so
//! error messages point at the right column even when the input contains
//! non-ASCII identifiers.

use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub enum Token {
    Number(f64),
    Ident(String),
    Plus,
    Minus,
    Star,
    Slash,
    Caret,
    LParen,
    RParen,
    Comma,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Spanned {
    pub token: Token,
    pub start: usize,
    pub end: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LexError {
    pub column: usize,
    pub message: String,
}

impl fmt::Display for LexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "column {}: {}", self.column + 1, self.message)
    }
}

impl std::error::Error for LexError {}

pub struct Lexer<'a> {
    chars: std::iter::Peekable<std::str::CharIndices<'a>>,
    src: &'a str,
}

impl<'a> Lexer<'a> {
    pub fn new(src: &'a str) -> Self {
        Lexer { chars: src.char_indices().peekable(), src }
    }

    fn column(&self, byte: usize) -> usize {
        self.src[..byte].chars().count()
    }

    fn error(&self, byte: usize, message: impl Into<String>) -> LexError {
        LexError { column: self.column(byte), message: message.into() }
    }

    fn number(&mut self, start: usize) -> Result<Spanned, LexError> {
        let mut end = start;
        let mut seen_dot = false;
        let mut seen_exp = false;
        while let Some(&(i, c)) = self.chars.peek() {
            let ok = match c {
                '0'..='9' => true,
                '.' if !seen_dot && !seen_exp => {
                    seen_dot = true;
                    true
                }
                'e' | 'E' if !seen_exp => {
                    seen_exp = true;
                    // allow a sign straight after the exponent marker
                    self.chars.next();
                    end = i + 1;
                    if let Some(&(j, '+' | '-')) = self.chars.peek() {
                        self.chars.next();
                        end = j + 1;
                    }
                    continue;
                }
                _ => false,
            };
            if !ok {
                break;
            }
            self.chars.next();
            end = i + c.len_utf8();
        }
        let text = &self.src[start..end];
        text.parse::<f64>()
            .map(|v| Spanned { token: Token::Number(v), start, end })
            .map_err(|_| self.error(start, format!("malformed number {text:?}")))
    }

    fn ident(&mut self, start: usize) -> Spanned {
        let mut end = start;
        while let Some(&(i, c)) = self.chars.peek() {
            if c.is_alphanumeric() || c == '_' {
                self.chars.next();
                end = i + c.len_utf8();
            } else {
                break;
            }
        }
        Spanned { token: Token::Ident(self.src[start..end].to_string()), start, end }
    }
}

impl<'a> Iterator for Lexer<'a> {
    type Item = Result<Spanned, LexError>;

    fn next(&mut self) -> Option<Self::Item> {
        while let Some(&(_, c)) = self.chars.peek() {
            if c.is_whitespace() {
                self.chars.next();
            } else {
                break;
            }
        }
        let &(start, c) = self.chars.peek()?;
        if c.is_ascii_digit() || c == '.' {
            return Some(self.number(start));
        }
        if c.is_alphabetic() || c == '_' {
            return Some(Ok(self.ident(start)));
        }
        self.chars.next();
        let token = match c {
            '+' => Token::Plus,
            '-' => Token::Minus,
            '*' => Token::Star,
            '/' => Token::Slash,
            '^' => Token::Caret,
            '(' => Token::LParen,
            ')' => Token::RParen,
            ',' => Token::Comma,
            other => return Some(Err(self.error(start, format!("unexpected character {other:?}")))),
        };
        Some(Ok(Spanned { token, start, end: start + c.len_utf8() }))
    }
}

pub fn tokenize(src: &str) -> Result<Vec<Spanned>, LexError> {
    Lexer::new(src).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(src: &str) -> Vec<Token> {
        tokenize(src).unwrap().into_iter().map(|s| s.token).collect()
    }

    #[test]
    fn numbers_and_operators() {
        assert_eq!(
            kinds("3.5e-2 * (x + 1)"),
            vec![
                Token::Number(0.035),
                Token::Star,
                Token::LParen,
                Token::Ident("x".into()),
                Token::Plus,
                Token::Number(1.0),
                Token::RParen,
            ]
        );
    }

    #[test]
    fn columns_count_characters_not_bytes() {
        let err = tokenize("größe + $").unwrap_err();
        assert_eq!(err.column, 8);
    }
}
