//! `$((...))`: evaluating an arithmetic expression, already expanded into text, as 64-bit
//! signed integers that wrap on overflow. Variables are read through a lookup; a value that is
//! not an integer is itself evaluated as an expression, as bash does (`x=1+2; $((x*2))` is 6; an
//! empty or unset one is 0), at most [`MAX_VALUE_DEPTH`] levels deep, so a variable naming itself
//! is an error, not a loop. Division by zero, a negative exponent, arrays and assignments are
//! errors, and so is an expression with so many operators or parentheses that parsing or
//! evaluating it could overflow the stack.

use brush_parser::ast;

use super::parse::unsupported;

/// The most operator characters and brackets one expression may hold. Every level of the parsed
/// tree is an operator and every level of the parser's recursion an operator, a parenthesis or
/// an array index's bracket, so this bounds both the parser's and the evaluation's recursion (the tool runs
/// with a small WebAssembly stack, and a level of prefix operators takes about a kilobyte of it in
/// a release build); real command lines stay far below it.
const MAX_OPERATORS: usize = 128;

/// How deeply variables' values may be evaluated as expressions of their own (bash allows more,
/// but a value naming a value naming a value is already rare).
const MAX_VALUE_DEPTH: usize = 10;

/// Why an expression has no value.
#[derive(Debug, PartialEq)]
pub(super) enum Error {
    /// The text is not an arithmetic expression (the parser's message).
    Syntax(String),
    /// It is one, but cannot be evaluated here (the whole message).
    Refused(String),
}

/// Evaluates `text` (already expanded: `$x` and `$(...)` replaced), reading variables through
/// `var`.
pub(super) fn evaluate(text: &str, var: &dyn Fn(&str) -> Option<String>) -> Result<i64, Error> {
    evaluate_at(text, var, 0)
}

/// [`evaluate`] of a text met `depth` variables deep.
fn evaluate_at(
    text: &str,
    var: &dyn Fn(&str) -> Option<String>,
    depth: usize,
) -> Result<i64, Error> {
    let operators = text
        .chars()
        .filter(|c| "()[]+-*/%<>=!~&|^?:,".contains(*c))
        .count();
    if operators > MAX_OPERATORS {
        return Err(Error::Refused(format!(
            "the arithmetic expression is too long or nested too deeply (at most {MAX_OPERATORS} operators and parentheses in one $((...)))"
        )));
    }
    // Blanks alone are an empty expression, 0, as in any shell (brush-parser refuses them).
    let parsed = brush_parser::arithmetic::parse(text.trim())
        .map_err(|error| Error::Syntax(error.to_string()))?;
    Evaluation { var, depth }.value(&parsed)
}

/// One expression's evaluation: its variables, and how many variables deep it was met.
struct Evaluation<'a> {
    var: &'a dyn Fn(&str) -> Option<String>,
    depth: usize,
}

impl Evaluation<'_> {
    /// The value of variable `name`: its integer, 0 when empty or unset, else its text evaluated.
    fn variable(&self, name: &str) -> Result<i64, Error> {
        let Some(text) = (self.var)(name) else {
            return Ok(0);
        };
        let text = text.trim();
        if text.is_empty() {
            return Ok(0);
        }
        if let Ok(number) = text.parse() {
            return Ok(number);
        }
        if self.depth >= MAX_VALUE_DEPTH {
            return Err(Error::Refused(format!(
                "{name}: expression recursion level exceeded (a variable's value names variables more than {MAX_VALUE_DEPTH} deep)"
            )));
        }
        evaluate_at(text, self.var, self.depth + 1)
    }

    fn value(&self, expr: &ast::ArithmeticExpr) -> Result<i64, Error> {
        use ast::ArithmeticExpr as E;
        use ast::BinaryOperator as B;
        Ok(match expr {
            E::Literal(value) => *value,
            E::Reference(ast::ArithmeticTarget::Variable(name)) => self.variable(name)?,
            E::Reference(_) => return Err(Error::Refused(unsupported("arrays"))),
            E::UnaryOp(op, inner) => {
                let value = self.value(inner)?;
                match op {
                    ast::UnaryOperator::UnaryPlus => value,
                    ast::UnaryOperator::UnaryMinus => value.wrapping_neg(),
                    ast::UnaryOperator::BitwiseNot => !value,
                    ast::UnaryOperator::LogicalNot => i64::from(value == 0),
                }
            }
            // `&&` and `||` do not evaluate their right side when the left decides (as in any
            // shell), so `$((n != 0 && 10 / n))` is no division by zero.
            E::BinaryOp(B::LogicalAnd, left, right) => {
                i64::from(self.value(left)? != 0 && self.value(right)? != 0)
            }
            E::BinaryOp(B::LogicalOr, left, right) => {
                i64::from(self.value(left)? != 0 || self.value(right)? != 0)
            }
            E::BinaryOp(op, left, right) => {
                let a = self.value(left)?;
                let b = self.value(right)?;
                match op {
                    B::Power if b < 0 => {
                        return Err(Error::Refused(format!(
                            "exponent less than 0 in $((...)) ({a} ** {b})"
                        )));
                    }
                    B::Power => wrapping_pow(a, b.unsigned_abs()),
                    B::Multiply => a.wrapping_mul(b),
                    B::Divide | B::Modulo if b == 0 => {
                        return Err(Error::Refused("division by zero in $((...))".to_string()));
                    }
                    B::Divide => a.wrapping_div(b),
                    B::Modulo => a.wrapping_rem(b),
                    B::Comma => b,
                    B::Add => a.wrapping_add(b),
                    B::Subtract => a.wrapping_sub(b),
                    B::ShiftLeft => a.wrapping_shl(u32::try_from(b).unwrap_or(0)),
                    B::ShiftRight => a.wrapping_shr(u32::try_from(b).unwrap_or(0)),
                    B::LessThan => i64::from(a < b),
                    B::LessThanOrEqualTo => i64::from(a <= b),
                    B::GreaterThan => i64::from(a > b),
                    B::GreaterThanOrEqualTo => i64::from(a >= b),
                    B::Equals => i64::from(a == b),
                    B::NotEquals => i64::from(a != b),
                    B::BitwiseAnd => a & b,
                    B::BitwiseXor => a ^ b,
                    B::BitwiseOr => a | b,
                    B::LogicalAnd => i64::from(a != 0 && b != 0),
                    B::LogicalOr => i64::from(a != 0 || b != 0),
                }
            }
            E::Conditional(test, yes, no) => {
                if self.value(test)? != 0 {
                    self.value(yes)?
                } else {
                    self.value(no)?
                }
            }
            E::Assignment(..) | E::BinaryAssignment(..) | E::UnaryAssignment(..) => {
                return Err(Error::Refused(unsupported(
                    "assignments inside $((...)) (write i=$((i+1)) instead)",
                )));
            }
        })
    }
}

/// `base` to the power `exponent`, wrapping as the shell's multiplication does, for any
/// exponent (squaring, so at most 64 steps).
fn wrapping_pow(mut base: i64, mut exponent: u64) -> i64 {
    let mut result: i64 = 1;
    while exponent > 0 {
        if exponent & 1 == 1 {
            result = result.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        exponent >>= 1;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Evaluates `text` with the variables `vars`.
    fn eval_with(text: &str, vars: &[(&str, &str)]) -> Result<i64, Error> {
        let lookup = |name: &str| {
            vars.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        };
        evaluate(text, &lookup)
    }

    fn eval(text: &str) -> Result<i64, Error> {
        eval_with(text, &[])
    }

    fn refused(result: Result<i64, Error>) -> String {
        match result {
            Err(Error::Refused(message)) => message,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn precedence_and_associativity_are_cs() {
        assert_eq!(eval("1 + 2 * 3"), Ok(7));
        assert_eq!(eval("10 - 4 - 3"), Ok(3));
        assert_eq!(eval("100 / 10 / 5"), Ok(2));
        assert_eq!(eval("2 ** 3 ** 2"), Ok(512));
        assert_eq!(eval("1 + 2 << 1"), Ok(6));
        assert_eq!(eval("7 % 4 * 2"), Ok(6));
        assert_eq!(eval("6 & 3 | 8 ^ 1"), Ok(11));
        assert_eq!(eval("1, 2, 3"), Ok(3));
    }

    #[test]
    fn parentheses_group() {
        assert_eq!(eval("(1 + 2) * 3"), Ok(9));
        assert_eq!(eval("((((4))))"), Ok(4));
        assert_eq!(eval("2 * (3 + (4 - 1)) / 3"), Ok(4));
    }

    #[test]
    fn unary_operators() {
        assert_eq!(eval("-5 + 3"), Ok(-2));
        assert_eq!(eval("- -5"), Ok(5));
        assert_eq!(eval("-(2 * 3)"), Ok(-6));
        assert_eq!(eval("+7"), Ok(7));
        assert_eq!(eval("~0"), Ok(-1));
        assert_eq!(eval("!0"), Ok(1));
        assert_eq!(eval("!5"), Ok(0));
    }

    #[test]
    fn literals_in_other_bases() {
        assert_eq!(eval("0x1f"), Ok(31));
        assert_eq!(eval("010"), Ok(8));
        assert_eq!(eval("2#101"), Ok(5));
        assert_eq!(eval(""), Ok(0));
        assert_eq!(eval("   "), Ok(0));
    }

    #[test]
    fn division_and_modulo_by_zero_are_errors() {
        assert_eq!(refused(eval("1 / 0")), "division by zero in $((...))");
        assert_eq!(refused(eval("5 % (2 - 2)")), "division by zero in $((...))");
        assert_eq!(
            refused(eval_with("10 / n", &[("n", "0")])),
            "division by zero in $((...))"
        );
    }

    #[test]
    fn overflow_wraps_and_never_panics() {
        assert_eq!(eval("9223372036854775807 + 1"), Ok(i64::MIN));
        assert_eq!(eval("-9223372036854775808"), Ok(i64::MIN));
        assert_eq!(eval("-9223372036854775807 - 2"), Ok(i64::MAX));
        assert_eq!(eval("9223372036854775807 * 2"), Ok(-2));
        // The one division that overflows.
        assert_eq!(eval("-9223372036854775807 - 1"), Ok(i64::MIN));
        assert_eq!(
            eval_with("m / -1", &[("m", "-9223372036854775808")]),
            Ok(i64::MIN)
        );
        assert_eq!(eval_with("m % -1", &[("m", "-9223372036854775808")]), Ok(0));
        assert_eq!(eval("-(-9223372036854775807 - 1)"), Ok(i64::MIN));
        assert_eq!(eval("2 ** 64"), Ok(0));
        assert_eq!(eval("3 ** 1000000"), Ok(3_i64.wrapping_pow(1_000_000)));
        assert_eq!(eval("1 << 64"), Ok(1));
        assert_eq!(eval("1 << -1"), Ok(1));
    }

    #[test]
    fn numbers_too_big_for_64_bits_are_syntax_errors() {
        assert!(matches!(
            eval("99999999999999999999999999"),
            Err(Error::Syntax(_))
        ));
        assert!(matches!(eval("0xfffffffffffffffff"), Err(Error::Syntax(_))));
        assert!(matches!(eval("65#1"), Err(Error::Syntax(_))));
    }

    #[test]
    fn variables_are_read_as_integers() {
        let vars = [("a", "6"), ("b", " 7 "), ("word", "abc"), ("empty", "")];
        assert_eq!(eval_with("a * b", &vars), Ok(42));
        assert_eq!(eval_with("word + 1", &vars), Ok(1));
        assert_eq!(eval_with("empty + unset", &vars), Ok(0));
        // A value that is not a number is an expression of its own, as in bash.
        assert_eq!(eval_with("x * 2", &[("x", "1+2")]), Ok(6));
        assert_eq!(
            eval_with("x", &[("x", "y * 2"), ("y", "a + 1"), ("a", "4")]),
            Ok(10)
        );
        let looping = eval_with("x + 1", &[("x", "x + 1")]);
        assert!(refused(looping).contains("recursion level exceeded"));
        assert!(matches!(
            eval_with("x", &[("x", "hello world")]),
            Err(Error::Syntax(_))
        ));
    }

    #[test]
    fn powers_need_a_non_negative_exponent_and_wrap() {
        assert!(refused(eval("2 ** -1")).contains("exponent less than 0"));
        assert_eq!(eval("2 ** 62"), Ok(1 << 62));
        assert_eq!(eval("(-2) ** 3"), Ok(-8));
        assert_eq!(eval("3 ** 0"), Ok(1));
        // An exponent past 32 bits still multiplies (it used to count as 0).
        assert_eq!(eval("1 ** 4294967296"), Ok(1));
        assert_eq!(eval("2 ** 4294967296"), Ok(0));
        assert_eq!(eval("(-1) ** 4294967297"), Ok(-1));
    }

    #[test]
    fn comparisons_logic_and_the_conditional() {
        assert_eq!(eval("3 < 4"), Ok(1));
        assert_eq!(eval("3 >= 4"), Ok(0));
        assert_eq!(eval("4 <= 4 && 5 > 4"), Ok(1));
        assert_eq!(eval("2 == 2"), Ok(1));
        assert_eq!(eval("2 != 2"), Ok(0));
        assert_eq!(eval("0 || 3"), Ok(1));
        assert_eq!(eval("0 && 3"), Ok(0));
        assert_eq!(eval("1 ? 10 : 20"), Ok(10));
        assert_eq!(eval("0 ? 10 : 0 ? 20 : 30"), Ok(30));
    }

    #[test]
    fn logical_operators_and_the_conditional_skip_the_side_not_taken() {
        assert_eq!(eval_with("n != 0 && 10 / n", &[("n", "0")]), Ok(0));
        assert_eq!(eval_with("n == 0 || 10 / n", &[("n", "0")]), Ok(1));
        assert_eq!(eval_with("n ? 10 / n : -1", &[("n", "0")]), Ok(-1));
        assert_eq!(
            refused(eval_with("n == 0 && 10 / n", &[("n", "0")])),
            "division by zero in $((...))"
        );
    }

    #[test]
    fn assignments_and_arrays_are_refused() {
        for text in ["i = 1", "i += 1", "i++", "--i", "a[0]", "a[1] + 1"] {
            let message = refused(eval(text));
            assert!(message.contains("not supported"), "{text}: {message}");
        }
    }

    #[test]
    fn malformed_expressions_are_syntax_errors() {
        for text in [
            "1 +", "* 2", "(1 + 2", "1 + 2)", "1 2", "()", "1 ? 2", "$", "a b", "1 +* 2", "@",
        ] {
            assert!(
                matches!(eval(text), Err(Error::Syntax(_))),
                "{text}: {:?}",
                eval(text)
            );
        }
    }

    #[test]
    fn hostile_nesting_and_length_are_refused_without_overflowing_the_stack() {
        let deep = format!("{}1{}", "(".repeat(100_000), ")".repeat(100_000));
        assert!(refused(eval(&deep)).contains("nested too deeply"));
        let unbalanced = "(".repeat(1_000_000);
        assert!(refused(eval(&unbalanced)).contains("nested too deeply"));
        let chain = vec!["1"; 100_000].join("+");
        assert!(refused(eval(&chain)).contains("too long"));
        let minuses = format!("{}1", "-".repeat(50_000));
        assert!(refused(eval(&minuses)).contains("too long"));
        let powers = vec!["2"; 10_000].join("**");
        assert!(refused(eval(&powers)).contains("too long"));
        let indexes = format!("{}1{}", "a[".repeat(50_000), "]".repeat(50_000));
        assert!(refused(eval(&indexes)).contains("too long"));
        // Up to the limit it evaluates, however the operators nest.
        let half = MAX_OPERATORS / 2;
        let nested = format!("{}1{}", "(".repeat(half), ")".repeat(half));
        assert_eq!(eval(&nested), Ok(1));
        assert_eq!(eval(&format!("{}1", "- ".repeat(MAX_OPERATORS))), Ok(1));
        assert_eq!(eval(&format!("{}1", "!".repeat(MAX_OPERATORS))), Ok(1));
        assert_eq!(eval(&format!("{}1", "~".repeat(MAX_OPERATORS - 1))), Ok(-2));
        assert_eq!(eval(&vec!["1"; half].join("**")), Ok(1));
        let ternary = format!("{}1{}", "1?".repeat(half), ":0".repeat(half));
        assert_eq!(eval(&ternary), Ok(1));
        let sum = vec!["1"; MAX_OPERATORS + 1].join("+");
        assert_eq!(eval(&sum), Ok(MAX_OPERATORS as i64 + 1));
        let long_number = "1".repeat(100_000);
        assert!(matches!(eval(&long_number), Err(Error::Syntax(_))));
    }
}
