//! This host's name: whole (`SLURM_SUBMIT_HOST`), or up to the first dot
//! as Slurm names nodes (the default node name).

/// The host name the kernel has, if it has one.
pub fn full() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the pointer and length describe `buf`, which outlives the call;
    // gethostname writes at most `len` bytes into it.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    (!name.is_empty()).then_some(name)
}

/// The host name up to the first dot; `localhost` when there is none.
pub fn short() -> String {
    match full().as_deref().and_then(|n| n.split('.').next()) {
        Some(short) if !short.is_empty() => short.to_string(),
        _ => "localhost".to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_short_name_has_no_dot() {
        let short = super::short();
        assert!(!short.is_empty() && !short.contains('.'));
    }
}
