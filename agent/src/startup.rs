//! The daemon's start-up checks, made by `granaryd validate` and `granaryd
//! run`: the configuration loaded and checked against this machine
//! ([`Config::load_for_this_machine`]: memory, hugepages, the secret file),
//! then what only the agent's own layers can tell: whether this host has the
//! RDMA device that `peers.transport = "rdma"` requires.
//!
//! [`Config::validate`] stays free of both, so that a configuration can be
//! checked (and tested) away from the machine that will run it, and the
//! configuration types depend on nothing above them.

use std::path::Path;

use crate::config::{Config, ConfigError, Problem, TransportSetting};
use crate::peers::transport;

/// Loads the configuration at `path` and checks it against this machine.
///
/// # Errors
///
/// As [`Config::load_for_this_machine`], and [`ConfigError::Invalid`] naming
/// `peers.transport` when RDMA is required and this host (or this build)
/// has none.
pub fn load_for_this_machine(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
    let path = path.as_ref();
    let cfg = Config::load_for_this_machine(path)?;
    check_transport(&cfg, transport::BUILT_WITH_RDMA, transport::probe_devices)
        .map_err(|e| e.with_file(path))?;
    Ok(cfg)
}

/// `peers.transport = "rdma"` needs a build with the `rdma` feature and a
/// device on this host; `probe` lists the host's devices (called only then).
fn check_transport<F>(cfg: &Config, built_with_rdma: bool, probe: F) -> Result<(), ConfigError>
where
    F: FnOnce() -> transport::ProbeResult,
{
    if cfg.peers.transport != TransportSetting::Rdma {
        return Ok(());
    }
    match transport::resolve(cfg.peers.transport, built_with_rdma, &probe()) {
        Ok(_) => Ok(()),
        Err(e) => Err(ConfigError::Invalid {
            file: None,
            problems: vec![Problem::new("peers.transport", e.to_string())],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "c5c64913cdf6c5268fb4da6deb8e09a0d04bcf1ff53244dbd5dd0c9bddaead23";

    fn config(transport: &str) -> Config {
        Config::from_toml_str(&format!(
            "[peers]\nmembership = \"static\"\njob_id = \"j\"\nnode_id = \"a\"\n\
             secret = \"{SECRET}\"\nencryption = \"off\"\ntransport = \"{transport}\"\n\
             members = [{{ id = \"a\", addr = \"10.0.0.1:7170\" }}]\n\
             [[dataset]]\nname = \"d\"\nroot = \"/tmp\"\n"
        ))
        .unwrap()
    }

    fn device() -> transport::ProbeResult {
        Ok(vec!["mlx5_0".to_owned()])
    }

    #[test]
    fn rdma_needs_the_feature_and_a_device_and_names_the_setting() {
        let rdma = config("rdma");
        assert!(check_transport(&rdma, true, device).is_ok());
        for (built, probe) in [
            (true, Ok(Vec::new())),
            (true, Err("no verbs".to_owned())),
            (false, Ok(vec!["mlx5_0".to_owned()])),
        ] {
            let e = check_transport(&rdma, built, || probe.clone()).unwrap_err();
            let fields: Vec<_> = e.problems().iter().map(|p| p.field.clone()).collect();
            assert_eq!(fields, ["peers.transport"], "{e}");
            assert!(e.to_string().contains("RDMA"), "{e}");
        }
    }

    #[test]
    fn other_transports_never_probe() {
        for t in ["auto", "tcp"] {
            let probe = || -> transport::ProbeResult { panic!("probed for {t}") };
            assert!(check_transport(&config(t), false, probe).is_ok());
        }
    }

    #[test]
    fn this_host_is_checked_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.toml");
        std::fs::write(&path, "[[dataset]]\nname = \"d\"\nroot = \"/tmp\"\n").unwrap();
        let cfg = load_for_this_machine(&path).unwrap();
        assert_eq!(cfg.datasets.len(), 1);
    }
}
