//! The host's RDMA devices, whatever this crate was built with: the probe
//! and the opening of a device that the agent's `peers.transport` uses.
//! Built with the `rdma` feature they go to libibverbs ([`crate::real`]);
//! without it there is no device, and opening one says why. Keeping the
//! feature's switch here lets the agent build one way only, and CI check
//! both ways by building this crate alone.

use crate::Verbs;

/// Whether this crate was built with the `rdma` feature (libibverbs).
pub const BUILT_WITH_RDMA: bool = cfg!(feature = "rdma");

/// Names of the RDMA devices present. Without the `rdma` feature: none.
pub fn probe() -> Result<Vec<String>, String> {
    #[cfg(feature = "rdma")]
    {
        crate::real::devices().map_err(|e| e.to_string())
    }
    #[cfg(not(feature = "rdma"))]
    {
        Ok(Vec::new())
    }
}

/// Opens `device` (the first one when `None`) on `port` with GID
/// `gid_index`. Without the `rdma` feature: an error saying so.
pub fn open(
    device: Option<&str>,
    port: u8,
    gid_index: u8,
) -> Result<Box<dyn Verbs + Send>, String> {
    #[cfg(feature = "rdma")]
    {
        crate::real::IbvNic::open(device, port, gid_index)
            .map(|n| Box::new(n) as Box<dyn Verbs + Send>)
            .map_err(|e| e.to_string())
    }
    #[cfg(not(feature = "rdma"))]
    {
        let _ = (device, port, gid_index);
        Err("granaryd was built without the rdma feature".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine has no RDMA device: the probe finds none, or (with the
    /// feature, on a kernel without RDMA support) cannot look; opening one
    /// fails either way with a message.
    #[test]
    fn a_host_without_a_device_probes_none_and_opens_none() {
        match probe() {
            Ok(devices) if !BUILT_WITH_RDMA => assert!(devices.is_empty()),
            Ok(_) | Err(_) => {}
        }
        if probe().is_ok_and(|d| d.is_empty()) {
            let e = open(None, 1, 0).err().expect("no device to open");
            assert!(!e.is_empty());
            if !BUILT_WITH_RDMA {
                assert!(e.contains("without the rdma feature"), "{e}");
            }
        }
    }
}
