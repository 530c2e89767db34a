//! The job's membership view, from the launcher, never voted: the static
//! list of the configuration, or Slurm's variables; and the job secret.

use crate::config::peer_secret::{self, WeakSecret};
use crate::config::{Membership, PeersConfig};
use granary_peer::view::{Member, View, ViewError};
use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Why the view or the secret could not be had.
#[derive(Debug)]
pub enum MembershipError {
    /// Peers are off.
    Off,
    /// The view is not valid.
    View(ViewError),
    /// The secret file could not be read.
    SecretFile(PathBuf, std::io::Error),
    /// No secret, or an empty one.
    NoSecret,
    /// The secret's estimated entropy is too low; `from` names where it
    /// came from (`peers.secret`, or `peers.secret_file PATH`).
    WeakSecret {
        /// `peers.secret` or `peers.secret_file PATH`.
        from: String,
        /// The estimate.
        weak: WeakSecret,
    },
    /// The view comes from loaders (`"session"`), not the configuration.
    FromSessions,
    /// The view has more members than `peers.max_members`.
    TooManyMembers {
        /// Its members.
        members: usize,
        /// `peers.max_members`.
        max: u32,
    },
}

impl fmt::Display for MembershipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MembershipError::Off => f.write_str("peers.membership is \"off\""),
            MembershipError::View(e) => write!(f, "membership view: {e}"),
            MembershipError::SecretFile(p, e) => {
                write!(f, "peers.secret_file {}: {e}", p.display())
            }
            MembershipError::NoSecret => f.write_str("the job secret is missing or empty"),
            MembershipError::WeakSecret { from, weak } => {
                write!(f, "the job secret ({from}) {weak}")
            }
            MembershipError::FromSessions => {
                f.write_str("peers.membership is \"session\": loaders hand in the view")
            }
            MembershipError::TooManyMembers { members, max } => write!(
                f,
                "the view has {members} members, more than peers.max_members ({max})"
            ),
        }
    }
}

impl std::error::Error for MembershipError {}

/// This agent's node id: `peers.node_id`, else `SLURMD_NODENAME` under
/// Slurm, else the host name.
pub(crate) fn node_id(cfg: &PeersConfig) -> String {
    if !cfg.node_id.is_empty() {
        return cfg.node_id.clone();
    }
    if cfg.membership == Membership::Slurm {
        if let Ok(n) = std::env::var("SLURMD_NODENAME") {
            if !n.is_empty() {
                return n;
            }
        }
    }
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .map(|h| h.split('.').next().unwrap_or_default().to_string())
        .unwrap_or_default()
}

/// Where this agent's peer listener binds, and the address other agents
/// reach it at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub node_id: String,
    pub listen: SocketAddr,
    pub advertise: String,
}

/// This agent's endpoint: with a view from the configuration, its entry
/// there; with views handed in by loaders, `peers.listen` (else
/// `0.0.0.0:peers.port`) and `peers.advertise` (else the listen address
/// when it names an IP, else `NODE_ID:PORT`).
pub(crate) fn endpoint(cfg: &PeersConfig, view: Option<&View>) -> Result<Endpoint, String> {
    let node_id = node_id(cfg);
    let listen_cfg = if cfg.listen.is_empty() {
        None
    } else {
        Some(
            cfg.listen
                .parse::<SocketAddr>()
                .map_err(|e| format!("peers.listen: {e}"))?,
        )
    };
    let configured_view = cfg.membership != Membership::Session;
    let (listen, advertise) = match view.filter(|_| configured_view) {
        Some(v) => {
            let me = v.index_of(&node_id).ok_or_else(|| {
                format!("this node's id {node_id:?} is not in the view (set peers.node_id)")
            })?;
            let addr = v.members()[me].addr.clone();
            let listen = match listen_cfg {
                Some(l) => l,
                None => {
                    let port = addr
                        .rsplit_once(':')
                        .and_then(|(_, p)| p.parse::<u16>().ok())
                        .ok_or_else(|| format!("bad address {addr:?}"))?;
                    SocketAddr::from(([0, 0, 0, 0], port))
                }
            };
            (listen, addr)
        }
        None => {
            let listen = listen_cfg.unwrap_or(SocketAddr::from(([0, 0, 0, 0], cfg.port)));
            let advertise = if !cfg.advertise.is_empty() {
                cfg.advertise.clone()
            } else if !listen.ip().is_unspecified() {
                listen.to_string()
            } else {
                format!("{node_id}:{}", listen.port())
            };
            (listen, advertise)
        }
    };
    Ok(Endpoint {
        node_id,
        listen,
        advertise,
    })
}

/// The view the configuration describes; `keep_bytes` is this agent's keep
/// area, the default keep of every member; `env` holds Slurm's variables.
pub fn view_from_config(
    cfg: &PeersConfig,
    keep_bytes: u64,
    env: &HashMap<String, String>,
) -> Result<View, MembershipError> {
    let view = configured_view(cfg, keep_bytes, env)?;
    if view.len() > cfg.max_members as usize {
        return Err(MembershipError::TooManyMembers {
            members: view.len(),
            max: cfg.max_members,
        });
    }
    Ok(view)
}

fn configured_view(
    cfg: &PeersConfig,
    keep_bytes: u64,
    env: &HashMap<String, String>,
) -> Result<View, MembershipError> {
    match cfg.membership {
        Membership::Off => Err(MembershipError::Off),
        Membership::Session => Err(MembershipError::FromSessions),
        Membership::Static => View::new(
            cfg.job_id.clone(),
            0,
            cfg.members.iter().map(|m| {
                Member::new(
                    m.id.clone(),
                    m.addr.clone(),
                    m.keep.map_or(keep_bytes, |k| k.bytes()),
                )
            }),
        )
        .map_err(MembershipError::View),
        Membership::Slurm => {
            View::from_slurm(env, cfg.port, keep_bytes).map_err(MembershipError::View)
        }
    }
}

/// The job secret: `peers.secret`, or the contents of `peers.secret_file`
/// without trailing whitespace; refused unless its estimated entropy
/// reaches 128 bits (`config::peer_secret`).
pub fn load_secret(cfg: &PeersConfig) -> Result<Vec<u8>, MembershipError> {
    let secret = read_secret(cfg)?;
    peer_secret::check(&secret).map_err(|weak| MembershipError::WeakSecret {
        from: match (&cfg.secret, &cfg.secret_file) {
            (None, Some(p)) => format!("peers.secret_file {}", p.display()),
            _ => "peers.secret".to_owned(),
        },
        weak,
    })?;
    Ok(secret)
}

/// The job secret as configured, not checked for strength.
fn read_secret(cfg: &PeersConfig) -> Result<Vec<u8>, MembershipError> {
    let secret = match (&cfg.secret, &cfg.secret_file) {
        (Some(s), _) => s.expose().as_bytes().to_vec(),
        (None, Some(p)) => {
            let mut b = std::fs::read(p).map_err(|e| MembershipError::SecretFile(p.clone(), e))?;
            while b.last().is_some_and(|c| c.is_ascii_whitespace()) {
                b.pop();
            }
            b
        }
        (None, None) => Vec::new(),
    };
    if secret.is_empty() {
        return Err(MembershipError::NoSecret);
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// A secret that passes the strength rule.
    const STRONG: &str = "c5c64913cdf6c5268fb4da6deb8e09a0d04bcf1ff53244dbd5dd0c9bddaead23";

    /// The configuration with `[peers]` `peers`, where `$S` stands for
    /// [`STRONG`].
    fn cfg(peers: &str) -> Config {
        Config::from_toml_str(&format!(
            "[peers]\n{}\n[[dataset]]\nname = \"d\"\nroot = \"/tmp\"\n",
            peers.replace("$S", STRONG)
        ))
        .unwrap()
    }

    /// A static view of job `j1` seen from member `b`, with `members`.
    fn static_cfg(members: &str) -> Config {
        cfg(&format!(
            "membership = \"static\"\njob_id = \"j1\"\nnode_id = \"b\"\nsecret = \"$S\"\nmembers = [{members}]"
        ))
    }

    /// A Slurm job seen from node `gpu02`, with the `extra` keys.
    fn slurm_cfg(extra: &str) -> Config {
        cfg(&format!(
            "membership = \"slurm\"\nnode_id = \"gpu02\"\nsecret = \"$S\"\n{extra}"
        ))
    }

    #[test]
    fn static_view_takes_keep_defaults_and_overrides() {
        let c = static_cfg(
            r#"{ id = "a", addr = "127.0.0.2:7170" }, { id = "b", addr = "127.0.0.3:7170", keep = "1GiB" }"#,
        );
        let v = view_from_config(&c.peers, 4096, &HashMap::new()).unwrap();
        assert_eq!(v.job_id(), "j1");
        assert_eq!(v.len(), 2);
        assert_eq!(v.members()[v.index_of("a").unwrap()].capacity, 4096);
        assert_eq!(v.members()[v.index_of("b").unwrap()].capacity, 1 << 30);
        assert_eq!(node_id(&c.peers), "b");
        assert_eq!(load_secret(&c.peers).unwrap(), STRONG.as_bytes());
    }

    #[test]
    fn slurm_view_comes_from_the_variables() {
        let c = slurm_cfg("port = 7300");
        let env: HashMap<String, String> = [
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_JOB_NODELIST", "gpu[01-03]"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let v = view_from_config(&c.peers, 10, &env).unwrap();
        assert_eq!(v.job_id(), "4242");
        assert_eq!(v.len(), 3);
        let m = &v.members()[v.index_of("gpu02").unwrap()];
        assert_eq!(m.addr, "gpu02:7300");
        // Without the variables: a clear error.
        let e = view_from_config(&c.peers, 10, &HashMap::new()).unwrap_err();
        assert!(e.to_string().contains("SLURM_JOB_ID"), "{e}");
        // More nodes than peers.max_members: refused, naming the setting.
        let small = slurm_cfg("max_members = 2");
        let e = view_from_config(&small.peers, 10, &env).unwrap_err();
        assert!(
            matches!(e, MembershipError::TooManyMembers { members: 3, max: 2 }),
            "{e}"
        );
        assert!(e.to_string().contains("peers.max_members"), "{e}");
    }

    #[test]
    fn endpoints_come_from_the_view_or_the_settings() {
        let c = static_cfg(
            r#"{ id = "a", addr = "127.0.0.2:7170" }, { id = "b", addr = "127.0.0.3:7171" }"#,
        );
        let v = view_from_config(&c.peers, 1, &HashMap::new()).unwrap();
        let e = endpoint(&c.peers, Some(&v)).unwrap();
        assert_eq!(e.listen, "0.0.0.0:7171".parse().unwrap());
        assert_eq!(e.advertise, "127.0.0.3:7171");
        let session = |keys: &str| {
            cfg(&format!(
                "membership = \"session\"\nsecret = \"$S\"\n{keys}"
            ))
        };
        let s = session("node_id = \"n7\"\nport = 7300");
        let e = endpoint(&s.peers, None).unwrap();
        assert_eq!(e.listen, "0.0.0.0:7300".parse().unwrap());
        assert_eq!(e.advertise, "n7:7300");
        let s = session(r#"listen = "127.0.0.4:7400""#);
        assert_eq!(
            endpoint(&s.peers, None).unwrap().advertise,
            "127.0.0.4:7400"
        );
        let s = session(r#"advertise = "gpu7.example:7170""#);
        assert_eq!(
            endpoint(&s.peers, None).unwrap().advertise,
            "gpu7.example:7170"
        );
        assert!(matches!(
            view_from_config(&s.peers, 1, &HashMap::new()),
            Err(MembershipError::FromSessions)
        ));
    }

    #[test]
    fn secret_file_is_read_and_trimmed_and_errors_are_clear() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("job.secret");
        std::fs::write(&p, format!("{STRONG}\n")).unwrap();
        let c = cfg(&format!(
            "membership = \"static\"\njob_id = \"j\"\nsecret_file = \"{}\"\nmembers = [{{ id = \"a\", addr = \"h:1\" }}]",
            p.display()
        ));
        assert_eq!(load_secret(&c.peers).unwrap(), STRONG.as_bytes());
        // A weak one is refused at start-up, naming the file, never
        // printing the secret.
        std::fs::write(&p, "abcdef-secret\n").unwrap();
        let e = load_secret(&c.peers).unwrap_err();
        assert!(matches!(e, MembershipError::WeakSecret { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("job.secret") && msg.contains("granary secret new PATH"),
            "{msg}"
        );
        assert!(!msg.contains("abcdef"), "{msg}");
        std::fs::write(&p, "\n").unwrap();
        assert!(matches!(
            load_secret(&c.peers),
            Err(MembershipError::NoSecret)
        ));
        std::fs::remove_file(&p).unwrap();
        let e = load_secret(&c.peers).unwrap_err();
        assert!(e.to_string().contains("job.secret"), "{e}");
    }
}
