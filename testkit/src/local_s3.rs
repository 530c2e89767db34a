//! What a client needs to reach an S3 store on loopback (SeaweedFS, the
//! light store): plain HTTP to an address, a region and credentials, as
//! agent settings or as a child process's environment.

use granary_agent::source::s3::S3Settings;
use std::net::SocketAddr;

/// A loopback store's credentials and region.
#[derive(Debug, Clone, Copy)]
pub struct Credentials {
    /// Access key id.
    pub access_key: &'static str,
    /// Secret access key.
    pub secret_key: &'static str,
    /// Region name the requests are signed for.
    pub region: &'static str,
}

impl Credentials {
    /// Agent settings for `bucket` through `addr` (the store or a proxy in
    /// front of it): plain HTTP, path-style addressing (`/bucket/key`:
    /// a loopback address has no bucket subdomains).
    pub fn settings(&self, bucket: &str, addr: SocketAddr) -> S3Settings {
        let mut s = S3Settings::new(bucket.to_owned());
        s.endpoint = Some(format!("http://{addr}"));
        s.allow_http = true;
        s.path_style = true;
        s.region = Some(self.region.into());
        s.access_key_id = Some(self.access_key.into());
        s.secret_access_key = Some(self.secret_key.into());
        s
    }

    /// Environment for a child process (`granary`, a Python client).
    pub fn env(&self) -> [(&'static str, String); 3] {
        [
            ("AWS_ACCESS_KEY_ID", self.access_key.to_owned()),
            ("AWS_SECRET_ACCESS_KEY", self.secret_key.to_owned()),
            ("AWS_REGION", self.region.to_owned()),
        ]
    }
}
