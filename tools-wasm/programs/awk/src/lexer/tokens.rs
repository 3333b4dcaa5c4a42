//! The kinds of token and the keywords.
#![allow(dead_code)]

use crate::error::SourceLocation;

/// All token types in AWK
#[derive(Debug, Clone, PartialEq)]
pub enum TokenKind {
    // Literals
    Number(f64),
    String(String),
    Regex(String),

    // Identifiers and keywords
    Identifier(String),
    Begin,
    End,
    BeginFile, // gawk extension
    EndFile,   // gawk extension
    If,
    Else,
    While,
    For,
    Do,
    Break,
    Continue,
    Function,
    Return,
    Delete,
    Exit,
    Next,
    Nextfile,
    Getline,
    Print,
    Printf,
    In,

    // Operators - Arithmetic
    Plus,    // +
    Minus,   // -
    Star,    // *
    Slash,   // /
    Percent, // %
    Caret,   // ^

    // Operators - Comparison
    Less,         // <
    LessEqual,    // <=
    Greater,      // >
    GreaterEqual, // >=
    Equal,        // ==
    NotEqual,     // !=

    // Operators - Logical
    And, // &&
    Or,  // ||
    Not, // !

    // Operators - Regex
    Match,    // ~
    NotMatch, // !~

    // Operators - Assignment
    Assign,        // =
    PlusAssign,    // +=
    MinusAssign,   // -=
    StarAssign,    // *=
    SlashAssign,   // /=
    PercentAssign, // %=
    CaretAssign,   // ^=

    // Operators - Increment/Decrement
    Increment, // ++
    Decrement, // --

    // Special operators
    Dollar,   // $ (field access)
    Question, // ?
    Colon,    // :
    Pipe,     // |
    Append,   // >>

    // Delimiters
    LeftParen,    // (
    RightParen,   // )
    LeftBrace,    // {
    RightBrace,   // }
    LeftBracket,  // [
    RightBracket, // ]
    Semicolon,    // ;
    Comma,        // ,
    Newline,      // \n (significant in AWK)

    // End of file
    Eof,
}

impl std::fmt::Display for TokenKind {
    /// The token as the program's text shows it, for error messages.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = match self {
            TokenKind::Number(n) => return write!(f, "the number {n}"),
            TokenKind::String(s) => return write!(f, "the string \"{s}\""),
            TokenKind::Regex(r) => return write!(f, "the regular expression /{r}/"),
            TokenKind::Identifier(name) => return write!(f, "`{name}`"),
            TokenKind::Newline => return write!(f, "the end of the line"),
            TokenKind::Eof => return write!(f, "the end of the program"),
            TokenKind::Begin => "BEGIN",
            TokenKind::End => "END",
            TokenKind::BeginFile => "BEGINFILE",
            TokenKind::EndFile => "ENDFILE",
            TokenKind::If => "if",
            TokenKind::Else => "else",
            TokenKind::While => "while",
            TokenKind::For => "for",
            TokenKind::Do => "do",
            TokenKind::Break => "break",
            TokenKind::Continue => "continue",
            TokenKind::Function => "function",
            TokenKind::Return => "return",
            TokenKind::Delete => "delete",
            TokenKind::Exit => "exit",
            TokenKind::Next => "next",
            TokenKind::Nextfile => "nextfile",
            TokenKind::Getline => "getline",
            TokenKind::Print => "print",
            TokenKind::Printf => "printf",
            TokenKind::In => "in",
            TokenKind::Plus => "+",
            TokenKind::Minus => "-",
            TokenKind::Star => "*",
            TokenKind::Slash => "/",
            TokenKind::Percent => "%",
            TokenKind::Caret => "^",
            TokenKind::Less => "<",
            TokenKind::LessEqual => "<=",
            TokenKind::Greater => ">",
            TokenKind::GreaterEqual => ">=",
            TokenKind::Equal => "==",
            TokenKind::NotEqual => "!=",
            TokenKind::And => "&&",
            TokenKind::Or => "||",
            TokenKind::Not => "!",
            TokenKind::Match => "~",
            TokenKind::NotMatch => "!~",
            TokenKind::Assign => "=",
            TokenKind::PlusAssign => "+=",
            TokenKind::MinusAssign => "-=",
            TokenKind::StarAssign => "*=",
            TokenKind::SlashAssign => "/=",
            TokenKind::PercentAssign => "%=",
            TokenKind::CaretAssign => "^=",
            TokenKind::Increment => "++",
            TokenKind::Decrement => "--",
            TokenKind::Dollar => "$",
            TokenKind::Question => "?",
            TokenKind::Colon => ":",
            TokenKind::Pipe => "|",
            TokenKind::Append => ">>",
            TokenKind::LeftParen => "(",
            TokenKind::RightParen => ")",
            TokenKind::LeftBrace => "{",
            TokenKind::RightBrace => "}",
            TokenKind::LeftBracket => "[",
            TokenKind::RightBracket => "]",
            TokenKind::Semicolon => ";",
            TokenKind::Comma => ",",
        };
        write!(f, "`{text}`")
    }
}

/// The token found where another was expected, in words.
pub fn describe(kind: Option<&TokenKind>) -> String {
    kind.map_or_else(
        || "the end of the program".to_string(),
        |kind| kind.to_string(),
    )
}

impl TokenKind {
    /// Check if this token is a keyword
    pub fn is_keyword(&self) -> bool {
        matches!(
            self,
            TokenKind::Begin
                | TokenKind::End
                | TokenKind::If
                | TokenKind::Else
                | TokenKind::While
                | TokenKind::For
                | TokenKind::Do
                | TokenKind::Break
                | TokenKind::Continue
                | TokenKind::Function
                | TokenKind::Return
                | TokenKind::Delete
                | TokenKind::Exit
                | TokenKind::Next
                | TokenKind::Nextfile
                | TokenKind::Getline
                | TokenKind::Print
                | TokenKind::Printf
                | TokenKind::In
        )
    }

    /// Check if this token can start an expression
    pub fn can_start_expression(&self) -> bool {
        matches!(
            self,
            TokenKind::Number(_)
                | TokenKind::String(_)
                | TokenKind::Regex(_)
                | TokenKind::Identifier(_)
                | TokenKind::LeftParen
                | TokenKind::Dollar
                | TokenKind::Not
                | TokenKind::Plus
                | TokenKind::Minus
                | TokenKind::Increment
                | TokenKind::Decrement
                | TokenKind::Getline
        )
    }

    /// Check if this token produces a value (for regex vs division disambiguation)
    pub fn produces_value(&self) -> bool {
        matches!(
            self,
            TokenKind::Number(_)
                | TokenKind::String(_)
                | TokenKind::Identifier(_)
                | TokenKind::RightParen
                | TokenKind::RightBracket
                | TokenKind::Increment
                | TokenKind::Decrement
        )
    }
}

/// A token with its location in the source
#[derive(Debug, Clone)]
pub struct Token {
    pub kind: TokenKind,
    pub location: SourceLocation,
}

impl Token {
    pub fn new(kind: TokenKind, line: usize, column: usize) -> Self {
        Self {
            kind,
            location: SourceLocation::new(line, column),
        }
    }
}

/// Map keyword strings to token kinds
pub fn keyword_to_token(s: &str) -> Option<TokenKind> {
    match s {
        "BEGIN" => Some(TokenKind::Begin),
        "END" => Some(TokenKind::End),
        "BEGINFILE" => Some(TokenKind::BeginFile),
        "ENDFILE" => Some(TokenKind::EndFile),
        "if" => Some(TokenKind::If),
        "else" => Some(TokenKind::Else),
        "while" => Some(TokenKind::While),
        "for" => Some(TokenKind::For),
        "do" => Some(TokenKind::Do),
        "break" => Some(TokenKind::Break),
        "continue" => Some(TokenKind::Continue),
        "function" => Some(TokenKind::Function),
        "return" => Some(TokenKind::Return),
        "delete" => Some(TokenKind::Delete),
        "exit" => Some(TokenKind::Exit),
        "next" => Some(TokenKind::Next),
        "nextfile" => Some(TokenKind::Nextfile),
        "getline" => Some(TokenKind::Getline),
        "print" => Some(TokenKind::Print),
        "printf" => Some(TokenKind::Printf),
        "in" => Some(TokenKind::In),
        _ => None,
    }
}
