//! The one field of a certificate quotad reads itself: its not-after, for the log and the
//! `quotad_tls_cert_expiry_seconds` gauge. A walk over the DER of RFC 5280's
//! `TBSCertificate` up to `validity`, rather than a full X.509 parser for one date; rustls has
//! already parsed the certificate properly by the time this runs.

/// DER tags met on the way.
const SEQUENCE: u8 = 0x30;
const VERSION: u8 = 0xa0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// The not-after of a DER certificate, unix seconds; `None` if it is not one.
pub(super) fn not_after(cert: &[u8]) -> Option<i64> {
    let (cert, _) = expect(cert, SEQUENCE)?;
    let (tbs, _) = expect(cert, SEQUENCE)?;
    let mut rest = tbs;
    // `version` is absent in a v1 certificate.
    if let Some((VERSION, _, after)) = element(rest) {
        rest = after;
    }
    // serialNumber, signature, issuer.
    for _ in 0..3 {
        rest = element(rest)?.2;
    }
    let (validity, _) = expect(rest, SEQUENCE)?;
    let (_, _, after_not_before) = element(validity)?;
    let (tag, time, _) = element(after_not_before)?;
    time_of(tag, time)
}

/// The contents of the element at the start of `input` if its tag is `tag`, and what follows.
fn expect(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (t, contents, rest) = element(input)?;
    (t == tag).then_some((contents, rest))
}

/// The element at the start of `input`: its tag, its contents and what follows it. Tags of one
/// byte only (all that `TBSCertificate` has up to `validity`).
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |len, &b| len << 8 | usize::from(b));
        rest = &rest[n..];
        len
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// An X.509 `Time`: UTCTime `YYMMDDHHMMSSZ` (years 1950 to 2049) or GeneralizedTime
/// `YYYYMMDDHHMMSSZ`, as RFC 5280 §4.1.2.5 requires them.
fn time_of(tag: u8, bytes: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(bytes).ok()?.strip_suffix('Z')?;
    let full = match (tag, text.len()) {
        (UTC_TIME, 12) => {
            let yy: u8 = text[..2].parse().ok()?;
            format!("{}{text}", if yy >= 50 { "19" } else { "20" })
        }
        (GENERALIZED_TIME, 14) => text.to_owned(),
        _ => return None,
    };
    chrono::NaiveDateTime::parse_from_str(&full, "%Y%m%d%H%M%S")
        .ok()
        .map(|t| t.and_utc().timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_until(year: i32, month: u8, day: u8) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        params.not_after = rcgen::date_time_ymd(year, month, day);
        params.self_signed(&key).unwrap().der().to_vec()
    }

    fn unix(y: i32, m: u32, d: u32) -> i64 {
        chrono::NaiveDate::from_ymd_opt(y, m, d)
            .unwrap()
            .and_hms_opt(0, 0, 0)
            .unwrap()
            .and_utc()
            .timestamp()
    }

    #[test]
    fn reads_a_utc_time_and_a_generalized_time() {
        // Before 2050 a certificate's dates are UTCTime, from 2050 GeneralizedTime.
        assert_eq!(not_after(&cert_until(2031, 5, 6)), Some(unix(2031, 5, 6)));
        assert_eq!(not_after(&cert_until(2061, 1, 2)), Some(unix(2061, 1, 2)));
    }

    #[test]
    fn what_is_not_a_certificate_gives_none() {
        let der = cert_until(2031, 5, 6);
        assert_eq!(not_after(&der[..der.len() / 3]), None);
        assert_eq!(not_after(b"not DER at all"), None);
        assert_eq!(not_after(&[]), None);
        assert_eq!(time_of(UTC_TIME, b"310506000000"), None, "no Z");
        assert_eq!(time_of(UTC_TIME, b"991306000000Z"), None, "month 13");
        assert_eq!(time_of(UTC_TIME, b"500101000000Z"), Some(unix(1950, 1, 1)));
    }
}
