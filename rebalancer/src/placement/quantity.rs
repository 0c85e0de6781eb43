//! Kubernetes resource quantities (`"1Gi"`, `"1000Mi"`, `"500m"`, `"1e3"`, `"1.5G"`), exact to
//! the nano unit as `resource.Quantity` keeps them (finer values round up, as it does).

/// A quantity in nano units (value × 10⁹).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity(pub i128);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("{0:?} is not a Kubernetes quantity (e.g. \"1Gi\", \"500Mi\", \"250m\", \"1e9\")")]
    Syntax(String),
    #[error("{0:?} is too large")]
    Overflow(String),
}

const NANO: i128 = 1_000_000_000;

impl Quantity {
    pub fn parse(s: &str) -> Result<Quantity, QuantityError> {
        let syntax = || QuantityError::Syntax(s.to_string());
        let overflow = || QuantityError::Overflow(s.to_string());
        let t = s.trim();
        let (neg, body) = match t.as_bytes().first() {
            Some(b'-') => (true, &t[1..]),
            Some(b'+') => (false, &t[1..]),
            _ => (false, t),
        };
        let end = body
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(body.len());
        let (num, suffix) = body.split_at(end);
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
            return Err(syntax());
        }
        // mantissa / 10^frac.len(), times the suffix's multiplier (in nano units, as num / den)
        let mut mantissa: i128 = 0;
        for c in int.chars().chain(frac.chars()) {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(i128::from(c as u8 - b'0')))
                .ok_or_else(overflow)?;
        }
        let mut den: i128 = 10i128.checked_pow(frac.len() as u32).ok_or_else(overflow)?;
        let pow2 = |e: u32| 1i128.checked_shl(e).ok_or_else(overflow);
        let pow10 = |e: u32| 10i128.checked_pow(e).ok_or_else(overflow);
        let mul: i128 = match suffix {
            "" => NANO,
            "n" => 1,
            "u" => 1_000,
            "m" => 1_000_000,
            "k" => NANO * 1_000,
            "M" => NANO * pow10(6)?,
            "G" => NANO * pow10(9)?,
            "T" => NANO * pow10(12)?,
            "P" => NANO * pow10(15)?,
            "E" => NANO * pow10(18)?,
            "Ki" => NANO * pow2(10)?,
            "Mi" => NANO * pow2(20)?,
            "Gi" => NANO * pow2(30)?,
            "Ti" => NANO * pow2(40)?,
            "Pi" => NANO * pow2(50)?,
            "Ei" => NANO * pow2(60)?,
            e if e.starts_with(['e', 'E']) => {
                let exp: i32 = e[1..].parse().map_err(|_| syntax())?;
                if exp >= 0 {
                    NANO.checked_mul(pow10(exp as u32)?).ok_or_else(overflow)?
                } else {
                    let d = pow10(exp.unsigned_abs())?;
                    den = den.checked_mul(d).ok_or_else(overflow)?;
                    NANO
                }
            }
            _ => return Err(syntax()),
        };
        let n = mantissa.checked_mul(mul).ok_or_else(overflow)?;
        // round up to the nano unit, as resource.Quantity does
        let v = n.checked_add(den - 1).ok_or_else(overflow)? / den;
        Ok(Quantity(if neg { -v } else { v }))
    }

    /// `Quantity.AsInt64`: the value when it is a whole number that fits an i64.
    pub fn as_i64(self) -> Option<i64> {
        if self.0 % NANO != 0 {
            return None;
        }
        i64::try_from(self.0 / NANO).ok()
    }

    pub fn is_positive(self) -> bool {
        self.0 > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_like_kubernetes() {
        let bytes = |s: &str| Quantity::parse(s).unwrap().as_i64();
        for (s, want) in [
            ("1Gi", Some(1 << 30)),
            ("1000Mi", Some(1000 << 20)),
            ("1.5Gi", Some(3 << 29)),
            ("128974848", Some(128_974_848)),
            ("129e6", Some(129_000_000)),
            ("123M", Some(123_000_000)),
            ("1k", Some(1000)),
            ("0.5", None),
            ("500m", None),
            ("2000m", Some(2)),
            ("0", Some(0)),
        ] {
            assert_eq!(bytes(s), want, "{s}");
        }
        assert_eq!(
            Quantity::parse("1").unwrap(),
            Quantity::parse("1000m").unwrap()
        );
        assert_eq!(Quantity::parse("1n").unwrap().0, 1);
        assert_eq!(
            Quantity::parse("1e-10").unwrap().0,
            1,
            "rounds up to a nano"
        );
        for bad in ["", "Gi", "1GB", "1.2.3", "abc", "1e", "--1"] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?}");
        }
        assert!(matches!(
            Quantity::parse("99999999999999999999999999999999Ei"),
            Err(QuantityError::Overflow(_))
        ));
    }
}
