//! Sizes as people write them (`1048576`, `512K`, `256MiB`, `1.5G`): one parser for the
//! command line, the config file, profiles and a call's `memory_limit`, so every place takes
//! the same forms and refuses the same way, and one floor for memory limits.

/// The smallest memory limit anything accepts: below it, no Python interpreter starts and
/// every run would end `memory_limit`.
pub const MIN_MEMORY_BYTES: u64 = 16 << 20;

/// What to write instead of a size that was refused.
pub const SIZE_HINT: &str =
    "write a number with an optional unit (binary multiples): 1048576, 512K, 256m, 2GiB, 1.5G";

/// Why a size was refused; each message quotes what was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// No number, or a malformed one (`ten`, `1.2.3`, ``).
    #[error("`{0}` is not a size")]
    NotASize(String),
    /// A number followed by something that is no unit (`12 parsecs`).
    #[error("unknown size unit `{unit}` in `{text}`")]
    UnknownUnit {
        /// The unit as written.
        unit: String,
        /// The whole size as written.
        text: String,
    },
    /// More bytes than 64 bits hold.
    #[error("`{0}` is too large")]
    TooLarge(String),
    /// A memory limit below [`MIN_MEMORY_BYTES`] (0 included).
    #[error("`{0}` is below 16MiB, too little for Python to start")]
    TooSmall(String),
}

/// A size in bytes: a whole or decimal number, then an optional unit, case and a space
/// between them ignored: `b`, `k`/`kb`/`kib`, `m`/`mb`/`mib`, `g`/`gb`/`gib`, `t`/`tb`/`tib`,
/// all binary multiples (as cgroups and Docker read `512m`). A decimal is rounded down to a
/// whole byte.
///
/// # Errors
/// [`SizeError`] with what was written.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let unit = unit.trim();
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ if number.is_empty() => return Err(SizeError::NotASize(text.to_owned())),
        _ => {
            return Err(SizeError::UnknownUnit {
                unit: unit.to_owned(),
                text: text.to_owned(),
            });
        }
    };
    if number.contains('.') {
        let value: f64 = number
            .parse()
            .map_err(|_| SizeError::NotASize(text.to_owned()))?;
        let bytes = (value * multiplier as f64).floor();
        // `u64::MAX as f64` rounds up to 2^64, which no u64 holds.
        if bytes >= u64::MAX as f64 {
            return Err(SizeError::TooLarge(text.to_owned()));
        }
        return Ok(bytes as u64);
    }
    if number.is_empty() {
        return Err(SizeError::NotASize(text.to_owned()));
    }
    number
        .parse::<u64>()
        .ok()
        .and_then(|value| value.checked_mul(multiplier))
        .ok_or_else(|| SizeError::TooLarge(text.to_owned()))
}

/// A memory limit: a size of at least [`MIN_MEMORY_BYTES`].
///
/// # Errors
/// As [`parse_size`], and [`SizeError::TooSmall`].
pub fn parse_memory_limit(text: &str) -> Result<u64, SizeError> {
    let bytes = parse_size(text)?;
    if bytes < MIN_MEMORY_BYTES {
        return Err(SizeError::TooSmall(text.trim().to_owned()));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_people_write() {
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size(" 512MiB "), Ok(512 << 20));
        assert_eq!(parse_size("256m"), Ok(256 << 20));
        assert_eq!(parse_size("2 G"), Ok(2 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("0.5k"), Ok(512));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
    }

    #[test]
    fn refusals_quote_what_was_written() {
        assert_eq!(parse_size(""), Err(SizeError::NotASize(String::new())));
        assert_eq!(parse_size("ten"), Err(SizeError::NotASize("ten".into())));
        assert_eq!(
            parse_size("1.2.3G"),
            Err(SizeError::NotASize("1.2.3G".into()))
        );
        assert_eq!(
            parse_size("12 Parsecs"),
            Err(SizeError::UnknownUnit {
                unit: "Parsecs".into(),
                text: "12 Parsecs".into()
            })
        );
        assert_eq!(
            parse_size("99999999999T"),
            Err(SizeError::TooLarge("99999999999T".into()))
        );
        assert_eq!(
            parse_size("99999999999999999999"),
            Err(SizeError::TooLarge("99999999999999999999".into()))
        );
    }

    #[test]
    fn a_memory_limit_has_a_floor() {
        assert_eq!(
            parse_memory_limit("0"),
            Err(SizeError::TooSmall("0".into()))
        );
        assert_eq!(
            parse_memory_limit("1048576"),
            Err(SizeError::TooSmall("1048576".into()))
        );
        assert_eq!(parse_memory_limit("16MiB"), Ok(16 << 20));
    }
}
