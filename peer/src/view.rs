//! Membership views: who is in the job, where to reach them, how much they
//! can cache.
//!
//! A [`View`] is immutable: `{job id, view epoch, members}`, each member a
//! stable node id (host name or configured id, never a launcher rank), a
//! peer address and an arena capacity in bytes. Members are kept sorted by
//! id, so the member index used everywhere else in this crate (ownership,
//! keep-sets, directories) does not depend on the order the launcher listed
//! them in. Two agents agree on a view when their [`View::digest`]s are
//! equal; they never vote.
//!
//! Views come from a static list ([`View::new`]), from Slurm's environment
//! ([`View::from_slurm`], with [`expand_hostlist`] expanding compressed host
//! lists exactly as `scontrol show hostnames` does), or from the canonical
//! bytes another agent sent ([`View::decode`]).

use std::collections::HashMap;
use std::fmt;

use sha2::{Digest, Sha256};

/// Longest job id, node id or peer address accepted, in bytes.
pub const MAX_NAME_LEN: usize = 255;
/// Most members a view may hold.
pub const MAX_MEMBERS: usize = 65_536;
/// Most host names one compressed host list may expand to.
pub const MAX_EXPANDED_HOSTS: usize = 65_536;
/// First bytes of a view's canonical encoding (and so of what its digest
/// covers).
pub const VIEW_MAGIC: &[u8; 16] = b"granary-view-v1\0";

/// One node of the job.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Member {
    /// Stable node id: the host name or a configured id. Never a rank.
    pub id: String,
    /// Where the node's peer listener is, e.g. `node01:7420`.
    pub addr: String,
    /// Arena capacity in bytes (weights ownership; see [`crate::owner`]).
    pub capacity: u64,
}

impl Member {
    /// A member from its three fields.
    pub fn new(id: impl Into<String>, addr: impl Into<String>, capacity: u64) -> Member {
        Member {
            id: id.into(),
            addr: addr.into(),
            capacity,
        }
    }
}

/// SHA-256 of a view's canonical encoding.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ViewDigest(pub [u8; 32]);

impl fmt::Debug for ViewDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ViewDigest({self})")
    }
}

impl fmt::Display for ViewDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Why a view could not be built or decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ViewError {
    /// The job id is empty or longer than [`MAX_NAME_LEN`].
    BadJobId,
    /// The view has no member.
    NoMembers,
    /// More than [`MAX_MEMBERS`] members.
    TooManyMembers(usize),
    /// A member id is empty, too long, or holds a control character.
    BadNodeId(String),
    /// A peer address is empty, too long, or holds a control character.
    BadAddress(String),
    /// Two members share an id.
    DuplicateNode(String),
    /// A required environment variable is missing.
    MissingEnv(&'static str),
    /// A compressed host list is malformed.
    Hostlist(HostlistError),
    /// Canonical bytes are malformed (truncated, bad magic, trailing bytes,
    /// not in canonical order, not UTF-8).
    Encoding(&'static str),
}

impl fmt::Display for ViewError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ViewError::BadJobId => write!(f, "job id must be 1..={MAX_NAME_LEN} bytes"),
            ViewError::NoMembers => write!(f, "a view needs at least one member"),
            ViewError::TooManyMembers(n) => {
                write!(
                    f,
                    "{n} members is more than the {MAX_MEMBERS} a view may hold"
                )
            }
            ViewError::BadNodeId(id) => write!(
                f,
                "node id {id:?} must be 1..={MAX_NAME_LEN} bytes without control characters"
            ),
            ViewError::BadAddress(a) => write!(
                f,
                "peer address {a:?} must be 1..={MAX_NAME_LEN} bytes without control characters"
            ),
            ViewError::DuplicateNode(id) => write!(f, "node id {id:?} appears twice in the view"),
            ViewError::MissingEnv(v) => write!(f, "environment variable {v} is not set"),
            ViewError::Hostlist(e) => write!(f, "host list: {e}"),
            ViewError::Encoding(what) => write!(f, "malformed view encoding: {what}"),
        }
    }
}

impl std::error::Error for ViewError {}

impl From<HostlistError> for ViewError {
    fn from(e: HostlistError) -> Self {
        ViewError::Hostlist(e)
    }
}

/// An immutable membership view. See the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    job_id: String,
    epoch: u64,
    members: Vec<Member>,
    digest: ViewDigest,
}

fn name_ok(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_NAME_LEN && !s.chars().any(char::is_control)
}

impl View {
    /// A view from a static member list, in any order. Members are sorted
    /// by id; ids must be unique.
    pub fn new(
        job_id: impl Into<String>,
        epoch: u64,
        members: impl IntoIterator<Item = Member>,
    ) -> Result<View, ViewError> {
        let job_id = job_id.into();
        if !name_ok(&job_id) {
            return Err(ViewError::BadJobId);
        }
        let mut members: Vec<Member> = members.into_iter().collect();
        if members.is_empty() {
            return Err(ViewError::NoMembers);
        }
        if members.len() > MAX_MEMBERS {
            return Err(ViewError::TooManyMembers(members.len()));
        }
        for m in &members {
            if !name_ok(&m.id) {
                return Err(ViewError::BadNodeId(m.id.clone()));
            }
            if !name_ok(&m.addr) {
                return Err(ViewError::BadAddress(m.addr.clone()));
            }
        }
        members.sort_by(|a, b| a.id.as_bytes().cmp(b.id.as_bytes()));
        if let Some(w) = members.windows(2).find(|w| w[0].id == w[1].id) {
            return Err(ViewError::DuplicateNode(w[0].id.clone()));
        }
        let mut view = View {
            job_id,
            epoch,
            members,
            digest: ViewDigest([0; 32]),
        };
        view.digest = ViewDigest(Sha256::digest(view.encode()).into());
        Ok(view)
    }

    /// A view from Slurm's environment, given as a map of variable names to
    /// values (pass `std::env::vars().collect()` in an agent).
    ///
    /// * job id: `SLURM_JOB_ID`, else `SLURM_JOBID`;
    /// * view epoch: `SLURM_RESTART_COUNT` (a requeued job is a new view),
    ///   0 when unset;
    /// * members: `SLURM_JOB_NODELIST`, else `SLURM_NODELIST`, expanded by
    ///   [`expand_hostlist`]; each member's id is its host name, its address
    ///   `host:port`, its capacity `capacity` (Slurm knows nothing of arenas,
    ///   so every node gets the configured one).
    pub fn from_slurm(
        env: &HashMap<String, String>,
        port: u16,
        capacity: u64,
    ) -> Result<View, ViewError> {
        let job_id = env
            .get("SLURM_JOB_ID")
            .or_else(|| env.get("SLURM_JOBID"))
            .ok_or(ViewError::MissingEnv("SLURM_JOB_ID"))?;
        let epoch = match env.get("SLURM_RESTART_COUNT") {
            None => 0,
            Some(s) => s
                .trim()
                .parse::<u64>()
                .map_err(|_| ViewError::Encoding("SLURM_RESTART_COUNT is not a number"))?,
        };
        let list = env
            .get("SLURM_JOB_NODELIST")
            .or_else(|| env.get("SLURM_NODELIST"))
            .ok_or(ViewError::MissingEnv("SLURM_JOB_NODELIST"))?;
        let hosts = expand_hostlist(list)?;
        View::new(
            job_id.trim(),
            epoch,
            hosts.into_iter().map(|h| {
                let addr = format!("{h}:{port}");
                Member::new(h, addr, capacity)
            }),
        )
    }

    /// The job this view belongs to.
    pub fn job_id(&self) -> &str {
        &self.job_id
    }

    /// The view epoch (a relaunch is a new epoch).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Members, sorted by id; a member's index here is its member index.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: a view has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The member index of node `id`, if it is in the view.
    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.members
            .binary_search_by(|m| m.id.as_bytes().cmp(id.as_bytes()))
            .ok()
    }

    /// SHA-256 of [`View::encode`]; independent of the order members were
    /// given in.
    pub fn digest(&self) -> ViewDigest {
        self.digest
    }

    /// The canonical encoding:
    ///
    /// ```text
    /// "granary-view-v1\0"            16 bytes
    /// job id                         u32 LE length, UTF-8 bytes
    /// view epoch                     u64 LE
    /// member count                   u32 LE
    /// per member, sorted by id bytes:
    ///   id                           u32 LE length, UTF-8 bytes
    ///   address                      u32 LE length, UTF-8 bytes
    ///   capacity                     u64 LE
    /// ```
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.members.len() * 48);
        out.extend_from_slice(VIEW_MAGIC);
        put_str(&mut out, &self.job_id);
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&(self.members.len() as u32).to_le_bytes());
        for m in &self.members {
            put_str(&mut out, &m.id);
            put_str(&mut out, &m.addr);
            out.extend_from_slice(&m.capacity.to_le_bytes());
        }
        out
    }

    /// The member count a canonical encoding announces, read from its
    /// header alone (nothing else is checked or allocated): lets a receiver
    /// refuse a view larger than it takes before decoding it.
    pub fn member_count(bytes: &[u8]) -> Result<usize, ViewError> {
        let mut r = Reader { b: bytes };
        if r.take(VIEW_MAGIC.len())? != VIEW_MAGIC {
            return Err(ViewError::Encoding("bad magic"));
        }
        r.string()?;
        r.u64()?;
        Ok(r.u32()? as usize)
    }

    /// Decodes and validates a canonical encoding; only bytes that
    /// [`View::encode`] could have produced are accepted.
    pub fn decode(bytes: &[u8]) -> Result<View, ViewError> {
        let mut r = Reader { b: bytes };
        if r.take(VIEW_MAGIC.len())? != VIEW_MAGIC {
            return Err(ViewError::Encoding("bad magic"));
        }
        let job_id = r.string()?;
        let epoch = r.u64()?;
        let n = r.u32()? as usize;
        if n > MAX_MEMBERS {
            return Err(ViewError::TooManyMembers(n));
        }
        let mut members = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            let id = r.string()?;
            let addr = r.string()?;
            let capacity = r.u64()?;
            members.push(Member { id, addr, capacity });
        }
        if !r.b.is_empty() {
            return Err(ViewError::Encoding("trailing bytes"));
        }
        if members
            .windows(2)
            .any(|w| w[0].id.as_bytes() >= w[1].id.as_bytes())
        {
            return Err(ViewError::Encoding("members not in canonical order"));
        }
        View::new(job_id, epoch, members)
    }
}

/// The longest canonical encoding of a view of `members` members (every
/// name [`MAX_NAME_LEN`] bytes long): a receiver that takes views of at most
/// `members` members can refuse longer bytes before reading them.
pub const fn max_encoded_len(members: usize) -> usize {
    let name = 4 + MAX_NAME_LEN;
    VIEW_MAGIC.len() + name + 8 + 4 + members * (2 * name + 8)
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ViewError> {
        if self.b.len() < n {
            return Err(ViewError::Encoding("truncated"));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u32(&mut self) -> Result<u32, ViewError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, ViewError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn string(&mut self) -> Result<String, ViewError> {
        let n = self.u32()? as usize;
        if n > MAX_NAME_LEN {
            return Err(ViewError::Encoding("name too long"));
        }
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| ViewError::Encoding("name is not UTF-8"))
    }
}

/// Why a compressed host list could not be expanded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostlistError {
    /// A `[` without its `]`, a `]` without its `[`, or nested brackets.
    UnbalancedBracket(String),
    /// An empty `[]` or an empty element inside brackets, as in `n[1,,2]`.
    EmptyRange(String),
    /// A range bound that is not a decimal number, as in `n[a-3]`.
    BadNumber(String),
    /// A range whose low bound exceeds its high bound, as in `n[5-3]`.
    Descending(String),
    /// The list expands to more than [`MAX_EXPANDED_HOSTS`] names.
    TooMany,
}

impl fmt::Display for HostlistError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostlistError::UnbalancedBracket(s) => write!(f, "unbalanced brackets in {s:?}"),
            HostlistError::EmptyRange(s) => write!(f, "empty range in {s:?}"),
            HostlistError::BadNumber(s) => write!(f, "range bound {s:?} is not a decimal number"),
            HostlistError::Descending(s) => write!(f, "range {s:?} runs downwards"),
            HostlistError::TooMany => {
                write!(f, "expands to more than {MAX_EXPANDED_HOSTS} host names")
            }
        }
    }
}

impl std::error::Error for HostlistError {}

/// Expands a Slurm compressed host list as `scontrol show hostnames` does:
///
/// * top-level elements are separated by commas (or white space); commas
///   inside brackets separate ranges, and empty top-level elements are
///   skipped;
/// * `prefix[ranges]suffix`: each range is `N` or `LO-HI`; numbers are
///   printed zero-padded to the width of the low bound as written
///   (`[01-10]` gives `01`..`10`, `[8-10]` gives `8`, `9`, `10`);
/// * several bracket groups multiply out, the leftmost varying slowest
///   (`r[1-2]n[1-2]` gives `r1n1 r1n2 r2n1 r2n2`);
/// * order and duplicates are kept as written.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, HostlistError> {
    let mut out = Vec::new();
    for elem in split_top(list)? {
        expand_element(elem, &mut out)?;
    }
    Ok(out)
}

/// Splits at commas and white space outside brackets.
fn split_top(list: &str) -> Result<Vec<&str>, HostlistError> {
    let mut parts = Vec::new();
    let mut depth = 0u32;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '[' => {
                if depth > 0 {
                    return Err(HostlistError::UnbalancedBracket(list.to_string()));
                }
                depth = 1;
            }
            ']' => {
                if depth == 0 {
                    return Err(HostlistError::UnbalancedBracket(list.to_string()));
                }
                depth = 0;
            }
            ',' | ' ' | '\t' | '\n' | '\r' if depth == 0 => {
                if i > start {
                    parts.push(&list[start..i]);
                }
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(HostlistError::UnbalancedBracket(list.to_string()));
    }
    if list.len() > start {
        parts.push(&list[start..]);
    }
    Ok(parts)
}

/// One number of a bracket group: its value and printed width.
#[derive(Clone, Copy)]
struct Num {
    value: u64,
    width: usize,
}

fn expand_element(elem: &str, out: &mut Vec<String>) -> Result<(), HostlistError> {
    // Literal pieces and bracket groups, alternating: lit0 [g0] lit1 [g1] ... litN.
    let mut literals = Vec::new();
    let mut groups: Vec<Vec<Num>> = Vec::new();
    let mut rest = elem;
    loop {
        match rest.find('[') {
            None => {
                literals.push(rest);
                break;
            }
            Some(open) => {
                literals.push(&rest[..open]);
                let close = rest[open..]
                    .find(']')
                    .map(|c| open + c)
                    .ok_or_else(|| HostlistError::UnbalancedBracket(elem.to_string()))?;
                groups.push(parse_group(&rest[open + 1..close])?);
                rest = &rest[close + 1..];
            }
        }
    }
    let total = groups
        .iter()
        .try_fold(1usize, |acc, g| acc.checked_mul(g.len()))
        .filter(|t| out.len().saturating_add(*t) <= MAX_EXPANDED_HOSTS)
        .ok_or(HostlistError::TooMany)?;
    // Odometer over the groups, last group fastest.
    let mut idx = vec![0usize; groups.len()];
    for _ in 0..total {
        let mut name = String::from(literals[0]);
        for (g, &i) in idx.iter().enumerate() {
            let n = groups[g][i];
            name.push_str(&format!("{:0width$}", n.value, width = n.width));
            name.push_str(literals[g + 1]);
        }
        out.push(name);
        for g in (0..groups.len()).rev() {
            idx[g] += 1;
            if idx[g] < groups[g].len() {
                break;
            }
            idx[g] = 0;
        }
    }
    Ok(())
}

fn parse_group(body: &str) -> Result<Vec<Num>, HostlistError> {
    if body.is_empty() {
        return Err(HostlistError::EmptyRange(format!("[{body}]")));
    }
    let mut nums = Vec::new();
    for range in body.split(',') {
        let range = range.trim();
        if range.is_empty() {
            return Err(HostlistError::EmptyRange(format!("[{body}]")));
        }
        let (lo_s, hi_s) = match range.split_once('-') {
            Some((lo, hi)) => (lo, hi),
            None => (range, range),
        };
        let lo = parse_num(lo_s)?;
        let hi = parse_num(hi_s)?;
        if lo > hi {
            return Err(HostlistError::Descending(range.to_string()));
        }
        let count = usize::try_from(hi - lo)
            .ok()
            .and_then(|d| d.checked_add(1))
            .filter(|c| nums.len().saturating_add(*c) <= MAX_EXPANDED_HOSTS)
            .ok_or(HostlistError::TooMany)?;
        let width = lo_s.len();
        nums.extend((0..count as u64).map(|k| Num {
            value: lo + k,
            width,
        }));
    }
    Ok(nums)
}

fn parse_num(s: &str) -> Result<u64, HostlistError> {
    if s.is_empty() || s.len() > 18 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(HostlistError::BadNumber(s.to_string()));
    }
    s.parse::<u64>()
        .map_err(|_| HostlistError::BadNumber(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(s: &str) -> Vec<String> {
        expand_hostlist(s).unwrap()
    }

    #[test]
    fn the_member_count_is_read_from_the_header_and_bounds_the_encoding() {
        let long = "x".repeat(MAX_NAME_LEN);
        let members = (0..3).map(|i| Member::new(format!("{i}{}", &long[1..]), long.clone(), 7));
        let v = View::new(long.clone(), 9, members).unwrap();
        let bytes = v.encode();
        assert_eq!(View::member_count(&bytes), Ok(3));
        assert_eq!(
            bytes.len(),
            max_encoded_len(3),
            "longest names: the bound is exact"
        );
        let short = View::new("j", 1, [Member::new("a", "h:1", 1)]).unwrap();
        assert!(short.encode().len() < max_encoded_len(1));
        // Only the header is read: a body cut short still gives the count.
        assert_eq!(
            View::member_count(&bytes[..VIEW_MAGIC.len() + 4 + MAX_NAME_LEN + 12]),
            Ok(3)
        );
        assert!(View::member_count(&bytes[..20]).is_err());
        assert!(View::member_count(b"not a view at all, no magic").is_err());
    }

    #[test]
    fn expands_like_scontrol() {
        assert_eq!(
            hosts("node[01-04,7]"),
            ["node01", "node02", "node03", "node04", "node7"]
        );
        assert_eq!(hosts("a,b[1-2],c"), ["a", "b1", "b2", "c"]);
        assert_eq!(hosts("n[8-10]"), ["n8", "n9", "n10"]);
        assert_eq!(hosts("n[008-010]"), ["n008", "n009", "n010"]);
        assert_eq!(
            hosts("r[1-2]n[01-02]"),
            ["r1n01", "r1n02", "r2n01", "r2n02"]
        );
        assert_eq!(hosts("gpu[3]-ib"), ["gpu3-ib"]);
        assert_eq!(hosts("x,,y,"), ["x", "y"]);
        assert_eq!(hosts("solo"), ["solo"]);
        assert_eq!(hosts(""), Vec::<String>::new());
    }

    #[test]
    fn malformed_lists_are_typed_errors() {
        let e = |s: &str| expand_hostlist(s).unwrap_err();
        assert!(matches!(e("n[1-2"), HostlistError::UnbalancedBracket(_)));
        assert!(matches!(e("n1-2]"), HostlistError::UnbalancedBracket(_)));
        assert!(matches!(e("n[[1]]"), HostlistError::UnbalancedBracket(_)));
        assert!(matches!(e("n[]"), HostlistError::EmptyRange(_)));
        assert!(matches!(e("n[1,,2]"), HostlistError::EmptyRange(_)));
        assert!(matches!(e("n[a-3]"), HostlistError::BadNumber(_)));
        assert!(matches!(e("n[1-]"), HostlistError::BadNumber(_)));
        assert!(matches!(e("n[5-3]"), HostlistError::Descending(_)));
        assert!(matches!(e("n[0-99999999]"), HostlistError::TooMany));
        assert!(matches!(e("a[0-999]b[0-999]"), HostlistError::TooMany));
    }

    fn three() -> Vec<Member> {
        vec![
            Member::new("c", "c:1", 30),
            Member::new("a", "a:1", 10),
            Member::new("b", "b:1", 20),
        ]
    }

    #[test]
    fn digest_ignores_member_order_and_sees_every_field() {
        let v1 = View::new("job", 1, three()).unwrap();
        let mut m = three();
        m.reverse();
        let v2 = View::new("job", 1, m).unwrap();
        assert_eq!(v1.digest(), v2.digest());
        assert_eq!(v1, v2);
        assert_eq!(v1.members()[0].id, "a");
        assert_eq!(v1.index_of("c"), Some(2));
        assert_eq!(v1.index_of("z"), None);
        assert_ne!(v1.digest(), View::new("job", 2, three()).unwrap().digest());
        assert_ne!(v1.digest(), View::new("jo", 1, three()).unwrap().digest());
        let mut m = three();
        m[0].capacity += 1;
        assert_ne!(v1.digest(), View::new("job", 1, m).unwrap().digest());
        let mut m = three();
        m[0].addr = "c:2".into();
        assert_ne!(v1.digest(), View::new("job", 1, m).unwrap().digest());
    }

    #[test]
    fn encoding_round_trips_and_rejects_garbage() {
        let v = View::new("job", 7, three()).unwrap();
        let b = v.encode();
        assert_eq!(View::decode(&b).unwrap(), v);
        assert!(View::decode(&b[..b.len() - 1]).is_err());
        let mut t = b.clone();
        t.push(0);
        assert_eq!(View::decode(&t), Err(ViewError::Encoding("trailing bytes")));
        let mut t = b.clone();
        t[0] ^= 1;
        assert_eq!(View::decode(&t), Err(ViewError::Encoding("bad magic")));
    }

    #[test]
    fn bad_views_are_rejected() {
        assert_eq!(View::new("", 0, three()), Err(ViewError::BadJobId));
        assert_eq!(View::new("j", 0, vec![]), Err(ViewError::NoMembers));
        let mut m = three();
        m.push(Member::new("a", "x:1", 1));
        assert_eq!(
            View::new("j", 0, m),
            Err(ViewError::DuplicateNode("a".into()))
        );
        let mut m = three();
        m[1].id = "bad\nid".into();
        assert!(matches!(View::new("j", 0, m), Err(ViewError::BadNodeId(_))));
        let mut m = three();
        m[1].addr = String::new();
        assert!(matches!(
            View::new("j", 0, m),
            Err(ViewError::BadAddress(_))
        ));
    }

    #[test]
    fn view_from_slurm_environment() {
        let mut env: HashMap<String, String> = [
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_JOB_NODELIST", "gpu[02-03],cpu1"),
            ("SLURM_RESTART_COUNT", "2"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let v = View::from_slurm(&env, 7420, 1 << 30).unwrap();
        assert_eq!(v.job_id(), "4242");
        assert_eq!(v.epoch(), 2);
        let ids: Vec<_> = v.members().iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["cpu1", "gpu02", "gpu03"]);
        assert_eq!(v.members()[1].addr, "gpu02:7420");
        assert_eq!(v.members()[2].capacity, 1 << 30);

        env.remove("SLURM_JOB_NODELIST");
        assert_eq!(
            View::from_slurm(&env, 1, 1),
            Err(ViewError::MissingEnv("SLURM_JOB_NODELIST"))
        );
        env.insert("SLURM_NODELIST".into(), "n[1-2".into());
        assert!(matches!(
            View::from_slurm(&env, 1, 1),
            Err(ViewError::Hostlist(HostlistError::UnbalancedBracket(_)))
        ));
        env.insert("SLURM_NODELIST".into(), "n[1-2]".into());
        env.remove("SLURM_JOB_ID");
        assert_eq!(
            View::from_slurm(&env, 1, 1),
            Err(ViewError::MissingEnv("SLURM_JOB_ID"))
        );
        env.insert("SLURM_JOBID".into(), "9".into());
        assert_eq!(View::from_slurm(&env, 1, 1).unwrap().len(), 2);
    }
}
