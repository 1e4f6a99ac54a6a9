//! gzip for answers that ask for it (`/metrics`): whether a request's `Accept-Encoding`
//! takes gzip (RFC 9110 §12.5.3: a coding with `q=0` is refused, `*` stands for any coding
//! not named), and the compression itself, at level 1 (BENCHMARKS.md: on a 16-NPU scrape it
//! makes 13.4 % of the bytes where the default level 6 makes 10.7 %, in 45 % of its time).

use axum::http::header::{GetAll, HeaderValue};
use std::io::Write;

/// The compression level: flate2's fastest.
const LEVEL: u32 = 1;

/// Whether the `Accept-Encoding` values take gzip.
pub(crate) fn accepts_gzip(values: GetAll<'_, HeaderValue>) -> bool {
    let mut star = None;
    for v in values {
        let Ok(v) = v.to_str() else { continue };
        for item in v.split(',') {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.trim().strip_prefix("q=").or(p.trim().strip_prefix("Q=")))
                .filter_map(|q| q.trim().parse::<f32>().ok())
                .next_back()
                .unwrap_or(1.0);
            match coding.as_str() {
                "gzip" | "x-gzip" => return q > 0.0,
                "*" => star = Some(q > 0.0),
                _ => {}
            }
        }
    }
    star.unwrap_or(false)
}

/// `data`, gzipped.
pub(crate) fn gzip(data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(data.len() / 8 + 64),
        flate2::Compression::new(LEVEL),
    );
    enc.write_all(data)?;
    enc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderMap;

    fn takes(values: &[&str]) -> bool {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("accept-encoding", v.parse().unwrap());
        }
        accepts_gzip(h.get_all("accept-encoding"))
    }

    #[test]
    fn gzip_is_taken_as_rfc_9110_says() {
        assert!(takes(&["gzip"]));
        assert!(takes(&["deflate, GZIP;q=0.5"]));
        assert!(takes(&["br", "x-gzip"]));
        assert!(takes(&["*"]));
        assert!(!takes(&[]));
        assert!(!takes(&["identity"]));
        assert!(!takes(&["gzip;q=0"]));
        assert!(!takes(&["gzip; q=0.0, *"]));
        assert!(!takes(&["*;q=0"]));
        assert!(!takes(&["gzipped"]));
    }

    #[test]
    fn what_is_gzipped_reads_back() {
        use std::io::Read;
        let text = "npu_chip_info_cube_utilization{id=\"0\"} 42\n".repeat(500);
        let z = gzip(text.as_bytes()).unwrap();
        assert!(z.len() * 10 < text.len(), "{} of {}", z.len(), text.len());
        let mut back = String::new();
        flate2::read::GzDecoder::new(&z[..])
            .read_to_string(&mut back)
            .unwrap();
        assert_eq!(back, text);
    }
}
