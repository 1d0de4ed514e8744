//! Server-sent events framing (WHATWG HTML §9.2): `retry:`, `id:`,
//! `event:` and `data:` lines, each event ended by a blank line. Data with
//! line breaks becomes several `data:` lines, so no payload can forge fields.

/// Append one event.
pub fn event(out: &mut Vec<u8>, id: Option<i64>, name: Option<&str>, data: &str) {
    if let Some(id) = id {
        out.extend_from_slice(format!("id: {id}\n").as_bytes());
    }
    if let Some(name) = name {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
    for line in data.split(['\n', '\r']) {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
}

/// Append the reconnection delay.
pub fn retry(out: &mut Vec<u8>, ms: u64) {
    out.extend_from_slice(format!("retry: {ms}\n\n").as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_line_breaks() {
        let mut out = Vec::new();
        event(&mut out, Some(7), Some("notification"), "{\"a\":1}");
        assert_eq!(out, b"id: 7\nevent: notification\ndata: {\"a\":1}\n\n");
        let mut out = Vec::new();
        event(&mut out, None, None, "a\nevent: forged\r\nb");
        assert_eq!(out, b"data: a\ndata: event: forged\ndata: \ndata: b\n\n");
    }
}
