//! Apptainer's (and Singularity's) image files, SIF: a header, a table of
//! descriptors, and data objects, one of which is the image's root
//! filesystem as a squashfs partition. gpuq finds that partition and
//! unpacks it as any squashfs image (`image_tools::squashfs`, with the
//! partition's offset), so a `.sif` built by `apptainer build` runs under
//! the node's OCI runtime unchanged; `container` starts its commands
//! through the image's own `/.singularity.d/actions/exec`, which sources
//! the image's environment scripts as `apptainer exec` does.
//!
//! The layout (little-endian, packed), from the SIF specification:
//! the header is a 32-byte launch line, `SIF_MAGIC` (10 bytes), version
//! and architecture (3 each), a 16-byte id, then eight 64-bit fields:
//! created, modified, free descriptors, total descriptors, descriptors'
//! offset and size, data's offset and size. A descriptor is 585 bytes:
//! type (i32), used (u8), id, group and link (u32 each), offset, size,
//! size with padding, created, modified, uid, gid (i64 each), a 128-byte
//! name and 384 bytes of type-specific data; a partition's begins with its
//! file system type and partition type (i32 each).

use std::fs::File;
use std::os::unix::fs::FileExt;

/// Where a SIF file says `SIF_MAGIC`.
const MAGIC_AT: usize = 32;
const MAGIC: &[u8] = b"SIF_MAGIC";
/// The header's size, and where its descriptor fields are.
const HEADER_LEN: usize = 128;
const TOTAL_AT: usize = 88;
const DESCRIPTORS_AT: usize = 96;
/// A descriptor's size, and where its fields are.
const DESCRIPTOR_LEN: usize = 585;
const USED_AT: usize = 4;
const OFFSET_AT: usize = 17;
const SIZE_AT: usize = 25;
const EXTRA_AT: usize = 73 + 128;
/// A data object that is a file system partition.
const DATA_PARTITION: i32 = 0x4004;
/// Its file system types: squashfs, and squashfs encrypted.
const FS_SQUASHFS: i32 = 1;
const FS_ENCRYPTED_SQUASHFS: i32 = 5;
/// Its partition types: a system, the primary system.
const PART_SYSTEM: i32 = 1;
const PART_PRIMARY_SYSTEM: i32 = 2;
/// More descriptors than any image has: a bound on what is read.
const MAX_DESCRIPTORS: u64 = 4096;

/// The command a SIF image's commands start through: it sources the
/// image's environment scripts, then execs its arguments.
pub const SIF_EXEC: &str = "/.singularity.d/actions/exec";

/// What `--container-entrypoint` starts in a SIF image, as `apptainer run`:
/// the image's runscript, with the arguments.
pub const SIF_RUN: &str = "/.singularity.d/actions/run";

/// Whether `head` (a file's first bytes) is a SIF file's.
pub fn is_sif(head: &[u8]) -> bool {
    head.get(MAGIC_AT..MAGIC_AT + MAGIC.len()) == Some(MAGIC)
}

fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_le_bytes(b[at..at + 4].try_into().expect("four bytes"))
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    i64::from_le_bytes(b[at..at + 8].try_into().expect("eight bytes"))
}

/// The offset and size of a SIF file's root file system (the primary
/// system partition, else the first system partition), a squashfs.
/// Errors are sentences naming the image as `shown`.
pub fn root_partition(file: &File, shown: &str) -> Result<(u64, u64), String> {
    let bad =
        |why: &str| format!("container image {shown} is a SIF file that cannot be read: {why}");
    let len = file.metadata().map_err(|e| bad(&e.to_string()))?.len();
    let mut header = [0u8; HEADER_LEN];
    file.read_exact_at(&mut header, 0)
        .map_err(|_| bad("its header is cut short"))?;
    let total = i64_at(&header, TOTAL_AT);
    let at = i64_at(&header, DESCRIPTORS_AT);
    if total < 0 || total as u64 > MAX_DESCRIPTORS || at < 0 {
        return Err(bad("its descriptor table is damaged"));
    }
    let mut table = vec![0u8; total as usize * DESCRIPTOR_LEN];
    file.read_exact_at(&mut table, at as u64)
        .map_err(|_| bad("its descriptor table is cut short"))?;
    let mut found: Option<(i32, u64, u64)> = None;
    let mut encrypted = false;
    for d in table.chunks_exact(DESCRIPTOR_LEN) {
        if d[USED_AT] == 0 || i32_at(d, 0) != DATA_PARTITION {
            continue;
        }
        let (fs, part) = (i32_at(d, EXTRA_AT), i32_at(d, EXTRA_AT + 4));
        encrypted |= fs == FS_ENCRYPTED_SQUASHFS;
        if fs != FS_SQUASHFS || !(part == PART_SYSTEM || part == PART_PRIMARY_SYSTEM) {
            continue;
        }
        let (offset, size) = (i64_at(d, OFFSET_AT), i64_at(d, SIZE_AT));
        if offset < 0 || size <= 0 || (offset as u64).saturating_add(size as u64) > len {
            return Err(bad("its root partition lies outside the file"));
        }
        // The primary system wins over any other system partition.
        if found.is_none_or(|(p, _, _)| p != PART_PRIMARY_SYSTEM && part == PART_PRIMARY_SYSTEM) {
            found = Some((part, offset as u64, size as u64));
        }
    }
    match found {
        Some((_, offset, size)) => Ok((offset, size)),
        None if encrypted => Err(format!(
            "container image {shown} is an encrypted SIF file: gpuq cannot decrypt it; \
             give an unencrypted image (apptainer build without --pem-path/--passphrase)"
        )),
        None => Err(bad("it has no squashfs system partition")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SIF file holding `partitions` (file system type, partition type,
    /// data) after a 4096-byte descriptor area, as `apptainer build` lays
    /// one out.
    fn sif_bytes(partitions: &[(i32, i32, &[u8])]) -> Vec<u8> {
        let total = 48usize;
        let data_at = 4096 + total * DESCRIPTOR_LEN;
        let mut out = vec![0u8; data_at];
        out[..32].copy_from_slice(b"#!/usr/bin/env run-singularity\n\0");
        out[MAGIC_AT..MAGIC_AT + MAGIC.len()].copy_from_slice(MAGIC);
        out[42..44].copy_from_slice(b"01");
        out[45..47].copy_from_slice(b"02");
        let put = |out: &mut Vec<u8>, at: usize, v: i64| {
            out[at..at + 8].copy_from_slice(&v.to_le_bytes())
        };
        put(&mut out, 80, (total - partitions.len()) as i64);
        put(&mut out, TOTAL_AT, total as i64);
        put(&mut out, DESCRIPTORS_AT, 4096);
        put(&mut out, 104, (partitions.len() * DESCRIPTOR_LEN) as i64);
        put(&mut out, 112, data_at as i64);
        for (i, (fs, part, data)) in partitions.iter().enumerate() {
            let d = 4096 + i * DESCRIPTOR_LEN;
            let offset = out.len();
            out[d..d + 4].copy_from_slice(&DATA_PARTITION.to_le_bytes());
            out[d + USED_AT] = 1;
            out[d + 5..d + 9].copy_from_slice(&(i as u32 + 1).to_le_bytes());
            put(&mut out, d + OFFSET_AT, offset as i64);
            put(&mut out, d + SIZE_AT, data.len() as i64);
            out[d + EXTRA_AT..d + EXTRA_AT + 4].copy_from_slice(&fs.to_le_bytes());
            out[d + EXTRA_AT + 4..d + EXTRA_AT + 8].copy_from_slice(&part.to_le_bytes());
            out.extend_from_slice(data);
        }
        let len = (out.len() - data_at) as i64;
        put(&mut out, 120, len);
        out
    }

    fn file_of(bytes: &[u8]) -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img.sif");
        std::fs::write(&p, bytes).unwrap();
        let f = File::open(&p).unwrap();
        (dir, f)
    }

    #[test]
    fn the_primary_squashfs_partition_is_the_root_and_others_are_refused_by_name() {
        let bytes = sif_bytes(&[
            (FS_SQUASHFS, 3, b"data-partition"),
            (FS_SQUASHFS, PART_SYSTEM, b"hsqs-system"),
            (FS_SQUASHFS, PART_PRIMARY_SYSTEM, b"hsqs-primary"),
        ]);
        assert!(is_sif(&bytes[..64]));
        assert!(!is_sif(
            b"hsqs and more, not a SIF header at all..........."
        ));
        let (_d, f) = file_of(&bytes);
        let (offset, size) = root_partition(&f, "/i/a.sif").unwrap();
        let at = offset as usize;
        assert_eq!(&bytes[at..at + size as usize], b"hsqs-primary");
        // Without a primary one, the system partition.
        let bytes = sif_bytes(&[(FS_SQUASHFS, PART_SYSTEM, b"hsqs-system")]);
        let (_d, f) = file_of(&bytes);
        let (offset, _) = root_partition(&f, "x").unwrap();
        assert_eq!(&bytes[offset as usize..][..4], b"hsqs");
        // Encrypted, none, cut short, pointing past the end.
        let (_d, f) = file_of(&sif_bytes(&[(
            FS_ENCRYPTED_SQUASHFS,
            PART_PRIMARY_SYSTEM,
            b"x",
        )]));
        let err = root_partition(&f, "/i/e.sif").unwrap_err();
        assert!(err.contains("/i/e.sif is an encrypted SIF file"), "{err}");
        let (_d, f) = file_of(&sif_bytes(&[(2, PART_PRIMARY_SYSTEM, b"ext3")]));
        let err = root_partition(&f, "x").unwrap_err();
        assert!(err.contains("no squashfs system partition"), "{err}");
        let bytes = sif_bytes(&[(FS_SQUASHFS, PART_PRIMARY_SYSTEM, b"hsqs")]);
        let (_d, f) = file_of(&bytes[..5000]);
        let err = root_partition(&f, "x").unwrap_err();
        assert!(err.contains("cut short"), "{err}");
        let mut bytes = bytes;
        let d = 4096;
        bytes[d + SIZE_AT..d + SIZE_AT + 8].copy_from_slice(&(1i64 << 40).to_le_bytes());
        let (_d, f) = file_of(&bytes);
        let err = root_partition(&f, "x").unwrap_err();
        assert!(err.contains("outside the file"), "{err}");
    }
}
