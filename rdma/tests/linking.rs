//! The default build neither needs nor links libibverbs; the `rdma`
//! build does. Checked on this test binary's own ELF dynamic section
//! (its DT_NEEDED entries), which links the library like any user.

use std::fs;

/// DT_NEEDED names of an ELF64 little-endian file.
fn needed(elf: &[u8]) -> Result<Vec<String>, String> {
    let u16_at = |o: usize| -> Result<u64, String> {
        elf.get(o..o + 2)
            .map(|b| u64::from(u16::from_le_bytes([b[0], b[1]])))
            .ok_or_else(|| format!("short ELF at {o}"))
    };
    let u32_at = |o: usize| -> Result<u64, String> {
        elf.get(o..o + 4)
            .map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .ok_or_else(|| format!("short ELF at {o}"))
    };
    let u64_at = |o: usize| -> Result<u64, String> {
        elf.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .ok_or_else(|| format!("short ELF at {o}"))
    };
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        return Err("not an ELF64 little-endian file".into());
    }
    let shoff = u64_at(0x28)? as usize;
    let shentsize = u16_at(0x3a)? as usize;
    let shnum = u16_at(0x3c)? as usize;
    let section = |i: usize| -> Result<(u64, usize, usize, usize), String> {
        let b = shoff + i * shentsize;
        // (type, offset, size, link)
        Ok((
            u32_at(b + 4)?,
            u64_at(b + 0x18)? as usize,
            u64_at(b + 0x20)? as usize,
            u32_at(b + 0x28)? as usize,
        ))
    };
    let mut names = Vec::new();
    for i in 0..shnum {
        let (ty, off, size, link) = section(i)?;
        if ty != 6 {
            continue; // not SHT_DYNAMIC
        }
        let (_, stroff, strsize, _) = section(link)?;
        let strtab = elf
            .get(stroff..stroff + strsize)
            .ok_or("dynstr out of file")?;
        for e in (off..off + size).step_by(16) {
            let tag = u64_at(e)?;
            if tag == 0 {
                break;
            }
            if tag == 1 {
                let at = u64_at(e + 8)? as usize;
                let s = strtab.get(at..).ok_or("name out of dynstr")?;
                let end = s.iter().position(|&c| c == 0).ok_or("unterminated name")?;
                names.push(String::from_utf8_lossy(&s[..end]).into_owned());
            }
        }
    }
    Ok(names)
}

fn this_binary_needs() -> Vec<String> {
    let exe = std::env::current_exe().expect("own path");
    let bytes = fs::read(&exe).expect("read own binary");
    needed(&bytes).expect("parse own ELF")
}

#[test]
fn elf_parser_finds_libc() {
    let names = this_binary_needs();
    assert!(
        names.iter().any(|n| n.starts_with("libc.so")),
        "libc among {names:?}"
    );
    assert!(needed(b"not an elf").is_err());
}

#[cfg(not(feature = "rdma"))]
#[test]
fn default_build_does_not_link_libibverbs() {
    // Use the library so it is linked in.
    let fabric = granary_rdma::Fabric::default();
    let nic = fabric.add_host();
    let d = granary_rdma::Driver::new(nic, 1 << 20, granary_rdma::DriverConfig::default());
    assert!(d.is_ok());
    let names = this_binary_needs();
    assert!(
        !names
            .iter()
            .any(|n| n.contains("ibverbs") || n.contains("rdmacm")),
        "default build links {names:?}"
    );
}

#[cfg(feature = "rdma")]
#[test]
fn rdma_build_links_libibverbs() {
    // Here there is no device (or no kernel support): the probe says so
    // without failing, and opening reports no device.
    let devices = granary_rdma::real::devices().expect("probe");
    if devices.is_empty() {
        assert!(matches!(
            granary_rdma::real::IbvNic::open(None, 1, 0),
            Err(granary_rdma::verbs::VerbsError::NoDevice(_))
        ));
    }
    // Take every backend call so the link resolves all its verbs symbols.
    use granary_rdma::real::IbvNic;
    use granary_rdma::verbs::Verbs;
    let calls: [*const (); 9] = [
        <IbvNic as Verbs>::register as *const (),
        <IbvNic as Verbs>::create_qp as *const (),
        <IbvNic as Verbs>::modify_qp as *const (),
        <IbvNic as Verbs>::qp_state as *const (),
        <IbvNic as Verbs>::destroy_qp as *const (),
        <IbvNic as Verbs>::post_send as *const (),
        <IbvNic as Verbs>::post_write as *const (),
        <IbvNic as Verbs>::post_recv as *const (),
        <IbvNic as Verbs>::poll_cq as *const (),
    ];
    assert!(std::hint::black_box(calls).iter().all(|f| !f.is_null()));
    let names = this_binary_needs();
    assert!(
        names.iter().any(|n| n.starts_with("libibverbs.so")),
        "rdma build links libibverbs: {names:?}"
    );
}
