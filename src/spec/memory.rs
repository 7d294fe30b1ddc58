//! Memory sizes (`--mem`): Slurm's units, read as binary (a `G` is GiB), so a
//! plain number is MiB as in Slurm. `16GB` and `16GiB` both mean 16 GiB:
//! users who write `GB` on a cluster mean what `free -g` shows.

/// Why a `--mem` value was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    #[error("memory size {input:?} {problem}; {MEM_FORMATS}")]
    Invalid {
        input: String,
        problem: &'static str,
    },
    #[error("memory size {input:?} has an unknown unit {unit:?}; {MEM_FORMATS}")]
    UnknownUnit { input: String, unit: String },
}

const MEM_FORMATS: &str = "use a number with an optional unit K, M, G or T \
     (also KB/KiB, MB/MiB, GB/GiB, TB/TiB, any case), e.g. 16G or 512M; a plain number is MiB";

/// Parses a `--mem` value into MiB, rounding a fraction of a MiB up.
pub fn parse_mem(input: &str) -> Result<u64, MemError> {
    let invalid = |problem| MemError::Invalid {
        input: input.to_string(),
        problem,
    };
    let text = input.trim();
    if text.is_empty() {
        return Err(invalid("is empty"));
    }
    if text.starts_with('-') {
        return Err(invalid("is negative"));
    }
    let number_len = text
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    let (number, unit) = text.split_at(number_len);
    if number.is_empty() || number == "." {
        return Err(invalid("has no number"));
    }
    let kib_per_unit: u128 = match unit.trim_start().to_ascii_lowercase().as_str() {
        "k" | "kb" | "kib" => 1,
        "" | "m" | "mb" | "mib" => 1 << 10,
        "g" | "gb" | "gib" => 1 << 20,
        "t" | "tb" | "tib" => 1 << 30,
        _ => {
            return Err(MemError::UnknownUnit {
                input: input.to_string(),
                unit: unit.trim().to_string(),
            })
        }
    };
    // Exact decimal arithmetic: "1.5G" is 1536 MiB, not 1535.99...
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if fraction.contains('.') || fraction.len() > 9 {
        return Err(invalid("is not a number"));
    }
    let scale = 10u128.pow(fraction.len() as u32);
    let digits: u128 = format!("{whole}{fraction}")
        .parse()
        .map_err(|_| invalid("is too large"))?;
    let kib = digits
        .checked_mul(kib_per_unit)
        .ok_or_else(|| invalid("is too large"))?
        .div_ceil(scale);
    let mib = kib.div_ceil(1 << 10);
    if mib == 0 {
        return Err(invalid("is zero; a job needs some memory (e.g. 16G)"));
    }
    u64::try_from(mib)
        .ok()
        .filter(|m| *m <= 1 << 40)
        .ok_or_else(|| invalid("is too large"))
}

/// Formats MiB in the largest unit that divides it evenly: `16G`, `1536M`.
/// `parse_mem` reads every output back to the same value.
pub fn format_mem(mib: u64) -> String {
    for (unit, size) in [("T", 1u64 << 20), ("G", 1 << 10)] {
        if mib >= size && mib % size == 0 {
            return format!("{}{unit}", mib / size);
        }
    }
    format!("{mib}M")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn units_and_spellings() {
        for (input, mib) in [
            ("512", 512),
            ("512M", 512),
            ("512m", 512),
            ("512MB", 512),
            ("512MiB", 512),
            ("16G", 16 << 10),
            ("16g", 16 << 10),
            ("16GB", 16 << 10),
            ("16gb", 16 << 10),
            ("16GiB", 16 << 10),
            ("16 G", 16 << 10),
            ("1T", 1 << 20),
            ("1TiB", 1 << 20),
            ("2048K", 2),
            ("1K", 1),
            ("1.5G", 1536),
            ("0.5", 1),
            (" 8G ", 8 << 10),
        ] {
            assert_eq!(parse_mem(input), Ok(mib), "{input}");
        }
    }

    #[test]
    fn bad_sizes_name_the_input_and_the_units() {
        let msg = parse_mem("12XB").unwrap_err().to_string();
        assert!(msg.contains("\"12XB\"") && msg.contains("\"XB\""), "{msg}");
        assert!(msg.contains("K, M, G or T"), "{msg}");
        for bad in [
            "0", "0G", "0.0", "-5", "-5G", "G", "", ".", "1.2.3", "16 GG", "1e3", "16P",
        ] {
            let err = parse_mem(bad).expect_err(bad);
            assert!(err.to_string().contains("16G"), "{bad}: {err}");
        }
        assert!(
            matches!(parse_mem("0"), Err(MemError::Invalid { problem, .. }) if problem.starts_with("is zero"))
        );
        assert!(matches!(
            parse_mem("-5"),
            Err(MemError::Invalid {
                problem: "is negative",
                ..
            })
        ));
        assert!(matches!(
            parse_mem("G"),
            Err(MemError::Invalid {
                problem: "has no number",
                ..
            })
        ));
        assert!(matches!(
            parse_mem("99999999999T"),
            Err(MemError::Invalid {
                problem: "is too large",
                ..
            })
        ));
    }

    #[test]
    fn formats_in_the_largest_even_unit() {
        assert_eq!(format_mem(512), "512M");
        assert_eq!(format_mem(1536), "1536M");
        assert_eq!(format_mem(16 << 10), "16G");
        assert_eq!(format_mem(1 << 20), "1T");
    }

    proptest! {
        #[test]
        fn format_then_parse_round_trips(mib in 1u64..(1 << 40)) {
            prop_assert_eq!(parse_mem(&format_mem(mib)), Ok(mib));
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,16}") {
            let _ = parse_mem(&s);
        }
    }
}
