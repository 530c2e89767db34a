//! The verbs trait over libibverbs (`rdma-sys`), feature `rdma`: the only
//! module of the crate with `unsafe`.
//!
//! One device context, one protection domain, one completion queue shared
//! by every queue pair, with a completion channel whose descriptor the
//! agent's engine sleeps on. Regions are anonymous mappings made here
//! (2 MiB hugepages when the length allows and the kernel has them, so the
//! NIC's translation table stays small) or the caller's own mapping
//! registered in place (the agent's shared arena, held until the
//! registration is released), registered with local write and, when
//! asked, window binds (`IBV_ACCESS_MW_BIND`) or remote write; remote read
//! is never requested. Peers write through memory windows of type 2
//! (`ibv_alloc_mw`), bound with `IBV_WR_BIND_MW` and revoked with
//! `IBV_WR_LOCAL_INV` work requests or `ibv_dealloc_mw`; a device without
//! type 2 windows is refused when it is opened. Queue pairs are RC, one
//! scatter/gather element, every work request signaled.
//!
//! This code has been compiled but never run against a device: see
//! `docs/rdma.md`.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::os::fd::BorrowedFd;
use std::ptr;

use granary_shm::arena::ArenaSlice;

use rdma_sys::*;

use crate::verbs::{
    Access, Endpoint, Mr, MwId, Opcode, QpCaps, QpId, QpState, RemoteAddr, Sge, Transition, Verbs,
    VerbsError, WcStatus, WindowSpan, WorkCompletion,
};

const HUGE_PAGE: usize = 2 << 20;
/// Entries of the shared completion queue.
pub const CQ_DEPTH: i32 = 8192;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn check(call: &'static str, rc: i32) -> Result<(), VerbsError> {
    if rc == 0 {
        Ok(())
    } else {
        // The verbs return the errno itself (positive) or -1 with errno set.
        Err(VerbsError::Os {
            call,
            errno: if rc > 0 { rc } else { errno() },
        })
    }
}

/// Names of the RDMA devices present (empty when there are none, or the
/// kernel has no RDMA support).
pub fn devices() -> Result<Vec<String>, VerbsError> {
    let mut n = 0i32;
    // SAFETY: `n` is a valid out-pointer; the list is freed below.
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        return match errno() {
            // No kernel support or no devices: nothing to list.
            libc::ENOSYS | libc::ENODEV | libc::ENOENT | 0 => Ok(Vec::new()),
            e => Err(VerbsError::Os {
                call: "ibv_get_device_list",
                errno: e,
            }),
        };
    }
    let mut names = Vec::new();
    // SAFETY: the list holds `n` device pointers and lives until freed below.
    let devs = unsafe { std::slice::from_raw_parts(list, usize::try_from(n).unwrap_or(0)) };
    for &dev in devs {
        // SAFETY: `dev` is a device of the live list.
        let name = unsafe { ibv_get_device_name(dev) };
        if !name.is_null() {
            // SAFETY: the name is a NUL-terminated string owned by the list.
            let s = unsafe { CStr::from_ptr(name) };
            names.push(s.to_string_lossy().into_owned());
        }
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { ibv_free_device_list(list) };
    Ok(names)
}

struct Region {
    base: *mut libc::c_void,
    /// Bytes of our own mapping to unmap; 0 for a caller's mapping.
    map_len: usize,
    mr: *mut ibv_mr,
    info: Mr,
    /// The caller's mapping registered in place: held so that it outlives
    /// the registration (dropped only after `ibv_dereg_mr`).
    _mapped: Option<ArenaSlice>,
}

struct Qp {
    qp: *mut ibv_qp,
    psn: u32,
}

struct Window {
    mw: *mut ibv_mw,
    /// The rkey of the last bind posted (the allocation's before any).
    rkey: u32,
}

/// `rkey` with its low byte (the key tag a type 2 bind may choose) one
/// up, wrapping: each bind of a window gives a new key.
fn next_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// A libibverbs device, port and GID index.
pub struct IbvNic {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    channel: *mut ibv_comp_channel,
    /// The channel's descriptor (-1 until it exists).
    channel_fd: i32,
    cq: *mut ibv_cq,
    port: u8,
    gid_index: u8,
    lid: u16,
    gid: [u8; 16],
    regions: BTreeMap<u32, Region>,
    next_region: u32,
    windows: BTreeMap<u32, Window>,
    next_window: u32,
    qps: BTreeMap<u32, Qp>,
}

// SAFETY: the verbs objects may be used from any thread; `IbvNic` is only
// used through `&mut self` (or `&self` for reads of its own maps and of
// registered memory by copy), so it is never shared without
// synchronization.
unsafe impl Send for IbvNic {}

impl std::fmt::Debug for IbvNic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvNic")
            .field("port", &self.port)
            .field("lid", &self.lid)
            .field("regions", &self.regions.len())
            .field("windows", &self.windows.len())
            .field("qps", &self.qps.len())
            .finish()
    }
}

impl IbvNic {
    /// Opens `device` (the first one when `None`) on `port` with GID
    /// `gid_index`.
    pub fn open(device: Option<&str>, port: u8, gid_index: u8) -> Result<IbvNic, VerbsError> {
        let mut n = 0i32;
        // SAFETY: `n` is a valid out-pointer; the list is freed below.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() || n <= 0 {
            if !list.is_null() {
                // SAFETY: `list` came from ibv_get_device_list.
                unsafe { ibv_free_device_list(list) };
            }
            return Err(VerbsError::NoDevice("no RDMA device found".into()));
        }
        let mut chosen = ptr::null_mut();
        // SAFETY: the list holds `n` device pointers and lives until freed
        // below.
        let devs = unsafe { std::slice::from_raw_parts(list, n as usize) };
        for &dev in devs {
            // SAFETY: `dev` is a device of the live list.
            let name = unsafe { ibv_get_device_name(dev) };
            let matches = match device {
                None => true,
                Some(_) if name.is_null() => false,
                Some(want) => {
                    // SAFETY: a NUL-terminated name owned by the list.
                    let s = unsafe { CStr::from_ptr(name) };
                    s.to_bytes() == want.as_bytes()
                }
            };
            if matches {
                chosen = dev;
                break;
            }
        }
        let ctx = if chosen.is_null() {
            ptr::null_mut()
        } else {
            // SAFETY: `chosen` is a device of the live list.
            unsafe { ibv_open_device(chosen) }
        };
        // SAFETY: the context keeps what it needs; the list is freed once.
        unsafe { ibv_free_device_list(list) };
        if ctx.is_null() {
            return Err(VerbsError::NoDevice(format!(
                "{} could not be opened",
                device.unwrap_or("the first device")
            )));
        }
        let mut nic = IbvNic {
            ctx,
            pd: ptr::null_mut(),
            channel: ptr::null_mut(),
            channel_fd: -1,
            cq: ptr::null_mut(),
            port,
            gid_index,
            lid: 0,
            gid: [0; 16],
            regions: BTreeMap::new(),
            next_region: 0,
            windows: BTreeMap::new(),
            next_window: 0,
            qps: BTreeMap::new(),
        };
        // From here on, Drop releases whatever was made.
        // SAFETY: all-zero is a valid ibv_device_attr (integers and bytes).
        let mut dev: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open and `dev` a valid out-pointer of its size.
        check("ibv_query_device", unsafe {
            ibv_query_device(ctx, &mut dev)
        })?;
        let type2 = ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A.0
            | ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0;
        if dev.device_cap_flags & type2 == 0 || dev.max_mw <= 0 {
            // Without windows the only remote-write key would be the whole
            // arena's: refused, and peers use TCP.
            return Err(VerbsError::NoDevice(format!(
                "{} has no type 2 memory windows",
                device.unwrap_or("the first device")
            )));
        }
        // SAFETY: `ctx` is an open context.
        nic.pd = unsafe { ibv_alloc_pd(ctx) };
        if nic.pd.is_null() {
            return Err(VerbsError::Os {
                call: "ibv_alloc_pd",
                errno: errno(),
            });
        }
        // SAFETY: `ctx` is an open context.
        nic.channel = unsafe { ibv_create_comp_channel(ctx) };
        if nic.channel.is_null() {
            return Err(VerbsError::Os {
                call: "ibv_create_comp_channel",
                errno: errno(),
            });
        }
        // SAFETY: the channel is live; its descriptor is its own.
        let fd = unsafe { (*nic.channel).fd };
        nic.channel_fd = fd;
        // SAFETY: fcntl on a descriptor we own; no memory involved.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above. Non-blocking, so `arm` can drain its events.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(VerbsError::Os {
                call: "fcntl",
                errno: errno(),
            });
        }
        // SAFETY: `ctx` is open and `channel` one of its channels; vector 0.
        nic.cq = unsafe { ibv_create_cq(ctx, CQ_DEPTH, ptr::null_mut(), nic.channel, 0) };
        if nic.cq.is_null() {
            return Err(VerbsError::Os {
                call: "ibv_create_cq",
                errno: errno(),
            });
        }
        nic.arm()?;
        // SAFETY: all-zero is a valid ibv_port_attr (plain integers).
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open and `attr` a valid out-pointer of its size.
        check("ibv_query_port", unsafe {
            ___ibv_query_port(ctx, port, &mut attr)
        })?;
        nic.lid = attr.lid;
        // SAFETY: all-zero is a valid ibv_gid (bytes).
        let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open and `gid` a valid out-pointer.
        check("ibv_query_gid", unsafe {
            ibv_query_gid(ctx, port, i32::from(gid_index), &mut gid)
        })?;
        // SAFETY: every bit pattern of the union is valid bytes.
        nic.gid = unsafe { gid.raw };
        Ok(nic)
    }

    fn qp(&self, qp: QpId) -> Result<*mut ibv_qp, VerbsError> {
        self.qps
            .get(&qp.0)
            .map(|q| q.qp)
            .ok_or(VerbsError::UnknownQp(qp))
    }

    fn local(&self, mr: &Mr, addr: u64, len: usize) -> Result<*mut u8, VerbsError> {
        let r = self
            .regions
            .get(&mr.id)
            .ok_or(VerbsError::UnknownMr(mr.id))?;
        let off = addr
            .checked_sub(r.info.addr)
            .ok_or(VerbsError::OutOfBounds)?;
        if off
            .checked_add(len as u64)
            .is_none_or(|end| end > r.info.len)
        {
            return Err(VerbsError::OutOfBounds);
        }
        Ok(r.base.cast::<u8>().wrapping_add(off as usize))
    }

    /// Acknowledges every notification waiting on the channel (they must
    /// all be acknowledged before the completion queue is destroyed).
    fn ack_events(&mut self) {
        let mut n = 0u32;
        loop {
            let mut cq = ptr::null_mut();
            let mut ctx = ptr::null_mut();
            // SAFETY: the channel is live and non-blocking; both are valid
            // out-pointers.
            let rc = unsafe { ibv_get_cq_event(self.channel, &mut cq, &mut ctx) };
            if rc != 0 {
                break;
            }
            n += 1;
        }
        if n > 0 {
            // SAFETY: `n` events of our only completion queue were taken
            // just above.
            unsafe { ibv_ack_cq_events(self.cq, n) };
        }
    }

    /// Registers `len` bytes at `base` with `access`.
    fn reg(
        &mut self,
        base: *mut libc::c_void,
        map_len: usize,
        len: u64,
        access: Access,
        mapped: Option<ArenaSlice>,
    ) -> Result<Mr, VerbsError> {
        let len_usize = usize::try_from(len).map_err(|_| VerbsError::Invalid("region length"))?;
        let mut flags = 0u32;
        if access.contains(Access::LOCAL_WRITE) {
            flags |= ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        }
        if access.contains(Access::REMOTE_WRITE) {
            // Remote write needs local write too (verbs rule).
            flags |= ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
                | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        }
        if access.contains(Access::MW_BIND) {
            flags |= ibv_access_flags::IBV_ACCESS_MW_BIND.0;
        }
        // SAFETY: `base` maps `len_usize` bytes that stay mapped until the
        // registration is released: our own mapping is unmapped only after
        // deregistration, and a caller's is held in `mapped`, dropped only
        // after deregistration (Drop).
        let mr = unsafe { ibv_reg_mr(self.pd, base, len_usize, flags as i32) };
        if mr.is_null() {
            return Err(VerbsError::Os {
                call: "ibv_reg_mr",
                errno: errno(),
            });
        }
        // SAFETY: `mr` is a live registration returned just above.
        let reg = unsafe { &*mr };
        let (lkey, rkey) = (reg.lkey, reg.rkey);
        let id = self.next_region;
        self.next_region += 1;
        let info = Mr {
            id,
            addr: base as u64,
            len,
            lkey,
            rkey,
            access,
        };
        self.regions.insert(
            id,
            Region {
                base,
                map_len,
                mr,
                info,
                _mapped: mapped,
            },
        );
        Ok(info)
    }

    fn map(len: usize) -> Result<(*mut libc::c_void, usize), VerbsError> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        if len.is_multiple_of(HUGE_PAGE) {
            // SAFETY: a fresh anonymous mapping; no existing memory touched.
            let p =
                unsafe { libc::mmap(ptr::null_mut(), len, prot, flags | libc::MAP_HUGETLB, -1, 0) };
            if p != libc::MAP_FAILED {
                return Ok((p, len));
            }
        }
        // SAFETY: a fresh anonymous mapping; no existing memory touched.
        let p = unsafe { libc::mmap(ptr::null_mut(), len, prot, flags, -1, 0) };
        if p == libc::MAP_FAILED {
            return Err(VerbsError::Os {
                call: "mmap",
                errno: errno(),
            });
        }
        Ok((p, len))
    }

    /// A signaled send-queue work request with no scatter/gather list.
    fn send_wr(wr_id: u64, opcode: ibv_wr_opcode::Type) -> ibv_send_wr {
        // SAFETY: all-zero is a valid ibv_send_wr (null pointers, zero
        // integers, unions of integers and pointers).
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.opcode = opcode;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr
    }

    /// Posts `wr` on `qp`'s send queue.
    fn post(&mut self, qp: QpId, wr: &mut ibv_send_wr) -> Result<(), VerbsError> {
        let qp = self.qp(qp)?;
        let mut bad = ptr::null_mut();
        // SAFETY: `qp` is live; `wr` and whatever it points at (its
        // scatter/gather element, a window) outlive the call, the verbs
        // copying the request; buffers are registered memory the caller
        // keeps until the completion.
        check("ibv_post_send", unsafe { ibv_post_send(qp, wr, &mut bad) })
    }

    fn post_send_wr(
        &mut self,
        qp: QpId,
        wr_id: u64,
        local: Sge,
        opcode: ibv_wr_opcode::Type,
        remote: Option<RemoteAddr>,
    ) -> Result<(), VerbsError> {
        let mut sge = ibv_sge {
            addr: local.addr,
            length: local.len,
            lkey: local.lkey,
        };
        let mut wr = IbvNic::send_wr(wr_id, opcode);
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        if let Some(r) = remote {
            wr.wr.rdma = rdma_t {
                remote_addr: r.addr,
                rkey: r.rkey,
            };
        }
        self.post(qp, &mut wr)
    }
}

impl Drop for IbvNic {
    fn drop(&mut self) {
        for q in std::mem::take(&mut self.qps).into_values() {
            // SAFETY: a live queue pair, destroyed once.
            unsafe { ibv_destroy_qp(q.qp) };
        }
        for w in std::mem::take(&mut self.windows).into_values() {
            // SAFETY: a live window, deallocated once, before the regions
            // it may be bound to are deregistered.
            unsafe { ibv_dealloc_mw(w.mw) };
        }
        for r in std::mem::take(&mut self.regions).into_values() {
            // SAFETY: a live registration, deregistered once.
            unsafe { ibv_dereg_mr(r.mr) };
            if r.map_len > 0 {
                // SAFETY: our own mapping, no longer registered, unmapped
                // once.
                unsafe { libc::munmap(r.base, r.map_len) };
            }
            // A caller's mapping (`r._mapped`) is released here, after
            // its deregistration.
        }
        if !self.cq.is_null() {
            self.ack_events();
            // SAFETY: no queue pair uses it any more and every event of
            // it has been acknowledged.
            unsafe { ibv_destroy_cq(self.cq) };
        }
        if !self.channel.is_null() {
            // SAFETY: the completion queue using it is gone; destroyed
            // once.
            unsafe { ibv_destroy_comp_channel(self.channel) };
        }
        if !self.pd.is_null() {
            // SAFETY: nothing registered on it any more.
            unsafe { ibv_dealloc_pd(self.pd) };
        }
        // SAFETY: everything made on the context is gone; closed once.
        unsafe { ibv_close_device(self.ctx) };
    }
}

fn mtu_code(m: crate::verbs::Mtu) -> ibv_mtu::Type {
    m as u8 as ibv_mtu::Type
}

impl Verbs for IbvNic {
    fn register(&mut self, len: u64, access: Access) -> Result<Mr, VerbsError> {
        let len_usize = usize::try_from(len).map_err(|_| VerbsError::Invalid("region length"))?;
        if len_usize == 0 {
            return Err(VerbsError::Invalid("region length"));
        }
        let (base, map_len) = IbvNic::map(len_usize)?;
        self.reg(base, map_len, len, access, None).inspect_err(|_| {
            // SAFETY: our own fresh mapping, never registered.
            unsafe { libc::munmap(base, map_len) };
        })
    }

    fn register_mapped(&mut self, mem: ArenaSlice, access: Access) -> Result<Mr, VerbsError> {
        if mem.is_empty() {
            return Err(VerbsError::Invalid("region length"));
        }
        let base = mem.as_mut_ptr().cast::<libc::c_void>();
        let len = mem.len() as u64;
        // Registered where it is: its pages are pinned and peers' RDMA
        // writes land in them, where the loaders read.
        self.reg(base, 0, len, access, Some(mem))
    }

    fn write_local(&mut self, mr: &Mr, addr: u64, data: &[u8]) -> Result<(), VerbsError> {
        let dst = self.local(mr, addr, data.len())?;
        // SAFETY: `dst..dst+len` lies inside our live mapping (checked by
        // `local`), which `data` cannot overlap.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    fn read_local(&self, mr: &Mr, addr: u64, out: &mut [u8]) -> Result<(), VerbsError> {
        let src = self.local(mr, addr, out.len())?;
        // SAFETY: `src..src+len` lies inside our live mapping (checked by
        // `local`), which `out` cannot overlap.
        unsafe { ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn create_qp(&mut self, caps: QpCaps) -> Result<QpId, VerbsError> {
        // SAFETY: all-zero is a valid ibv_qp_init_attr.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = self.cq;
        init.recv_cq = self.cq;
        init.cap = ibv_qp_cap {
            max_send_wr: caps.max_send_wr,
            max_recv_wr: caps.max_recv_wr,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 1;
        // SAFETY: `pd` is live and `init` a valid attribute block.
        let qp = unsafe { ibv_create_qp(self.pd, &mut init) };
        if qp.is_null() {
            return Err(VerbsError::Os {
                call: "ibv_create_qp",
                errno: errno(),
            });
        }
        // SAFETY: `qp` is the live queue pair just created.
        let num = unsafe { &*qp }.qp_num;
        let psn = num.wrapping_mul(2_654_435_761) & 0xff_ffff;
        self.qps.insert(num, Qp { qp, psn });
        Ok(QpId(num))
    }

    fn endpoint(&self, qp: QpId) -> Result<Endpoint, VerbsError> {
        let q = self.qps.get(&qp.0).ok_or(VerbsError::UnknownQp(qp))?;
        Ok(Endpoint {
            qp_num: qp.0,
            lid: self.lid,
            gid: self.gid,
            psn: q.psn,
        })
    }

    fn modify_qp(&mut self, qp: QpId, to: Transition) -> Result<(), VerbsError> {
        let psn = self.qps.get(&qp.0).ok_or(VerbsError::UnknownQp(qp))?.psn;
        let raw = self.qp(qp)?;
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        let m = |x: ibv_qp_attr_mask| x.0;
        let mask = match to {
            Transition::Init => {
                a.qp_state = ibv_qp_state::IBV_QPS_INIT;
                a.pkey_index = 0;
                a.port_num = self.port;
                // Never IBV_ACCESS_REMOTE_READ. Remote writes are checked
                // against the windows bound through this queue pair.
                a.qp_access_flags = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
                    | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
                    | ibv_access_flags::IBV_ACCESS_MW_BIND.0;
                m(ibv_qp_attr_mask::IBV_QP_STATE)
                    | m(ibv_qp_attr_mask::IBV_QP_PKEY_INDEX)
                    | m(ibv_qp_attr_mask::IBV_QP_PORT)
                    | m(ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS)
            }
            Transition::Rtr { remote, timing } => {
                a.qp_state = ibv_qp_state::IBV_QPS_RTR;
                a.path_mtu = mtu_code(timing.mtu);
                a.dest_qp_num = remote.qp_num;
                a.rq_psn = remote.psn;
                // No RDMA reads or atomics are accepted.
                a.max_dest_rd_atomic = 0;
                a.min_rnr_timer = timing.min_rnr_timer;
                a.ah_attr.dlid = remote.lid;
                a.ah_attr.sl = 0;
                a.ah_attr.src_path_bits = 0;
                a.ah_attr.port_num = self.port;
                if remote.gid != [0; 16] {
                    a.ah_attr.is_global = 1;
                    a.ah_attr.grh.dgid = ibv_gid { raw: remote.gid };
                    a.ah_attr.grh.sgid_index = self.gid_index;
                    a.ah_attr.grh.hop_limit = 64;
                }
                m(ibv_qp_attr_mask::IBV_QP_STATE)
                    | m(ibv_qp_attr_mask::IBV_QP_AV)
                    | m(ibv_qp_attr_mask::IBV_QP_PATH_MTU)
                    | m(ibv_qp_attr_mask::IBV_QP_DEST_QPN)
                    | m(ibv_qp_attr_mask::IBV_QP_RQ_PSN)
                    | m(ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC)
                    | m(ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER)
            }
            Transition::Rts { timing } => {
                a.qp_state = ibv_qp_state::IBV_QPS_RTS;
                a.timeout = timing.timeout;
                a.retry_cnt = timing.retry_cnt;
                a.rnr_retry = timing.rnr_retry;
                a.sq_psn = psn;
                a.max_rd_atomic = 0;
                m(ibv_qp_attr_mask::IBV_QP_STATE)
                    | m(ibv_qp_attr_mask::IBV_QP_TIMEOUT)
                    | m(ibv_qp_attr_mask::IBV_QP_RETRY_CNT)
                    | m(ibv_qp_attr_mask::IBV_QP_RNR_RETRY)
                    | m(ibv_qp_attr_mask::IBV_QP_SQ_PSN)
                    | m(ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC)
            }
        };
        // SAFETY: `raw` is live; `a` is a valid attribute block for `mask`.
        check("ibv_modify_qp", unsafe {
            ibv_modify_qp(raw, &mut a, mask as i32)
        })
    }

    fn qp_state(&self, qp: QpId) -> Result<QpState, VerbsError> {
        let raw = self.qp(qp)?;
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: all-zero is a valid ibv_qp_init_attr.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `raw` is live; both out-pointers are valid.
        check("ibv_query_qp", unsafe {
            ibv_query_qp(
                raw,
                &mut a,
                ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                &mut init,
            )
        })?;
        Ok(match a.qp_state {
            ibv_qp_state::IBV_QPS_RESET => QpState::Reset,
            ibv_qp_state::IBV_QPS_INIT => QpState::Init,
            ibv_qp_state::IBV_QPS_RTR => QpState::Rtr,
            ibv_qp_state::IBV_QPS_RTS => QpState::Rts,
            _ => QpState::Error,
        })
    }

    fn destroy_qp(&mut self, qp: QpId) -> Result<(), VerbsError> {
        let q = self.qps.remove(&qp.0).ok_or(VerbsError::UnknownQp(qp))?;
        // SAFETY: a live queue pair, removed from the map, destroyed once.
        check("ibv_destroy_qp", unsafe { ibv_destroy_qp(q.qp) })
    }

    fn post_send(&mut self, qp: QpId, wr_id: u64, local: Sge) -> Result<(), VerbsError> {
        self.post_send_wr(qp, wr_id, local, ibv_wr_opcode::IBV_WR_SEND, None)
    }

    fn post_write(
        &mut self,
        qp: QpId,
        wr_id: u64,
        local: Sge,
        remote: RemoteAddr,
    ) -> Result<(), VerbsError> {
        self.post_send_wr(
            qp,
            wr_id,
            local,
            ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            Some(remote),
        )
    }

    fn post_recv(&mut self, qp: QpId, wr_id: u64, local: Sge) -> Result<(), VerbsError> {
        let qp = self.qp(qp)?;
        let mut sge = ibv_sge {
            addr: local.addr,
            length: local.len,
            lkey: local.lkey,
        };
        let mut wr = ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: `qp` is live; `wr` and `sge` outlive the call; the buffer
        // is registered memory the driver keeps until the completion.
        check("ibv_post_recv", unsafe {
            ibv_post_recv(qp, &mut wr, &mut bad)
        })
    }

    fn alloc_mw(&mut self) -> Result<MwId, VerbsError> {
        // SAFETY: `pd` is live; the window is released by dealloc_mw or
        // Drop.
        let mw = match unsafe { ibv_alloc_mw(self.pd, ibv_mw_type::IBV_MW_TYPE_2) } {
            Some(mw) if !mw.is_null() => mw,
            _ => {
                return Err(VerbsError::Os {
                    call: "ibv_alloc_mw",
                    errno: errno(),
                })
            }
        };
        // SAFETY: `mw` is the live window just allocated.
        let rkey = unsafe { &*mw }.rkey;
        let id = self.next_window;
        self.next_window = self.next_window.wrapping_add(1);
        self.windows.insert(id, Window { mw, rkey });
        Ok(MwId(id))
    }

    fn dealloc_mw(&mut self, mw: MwId) -> Result<(), VerbsError> {
        let w = self
            .windows
            .remove(&mw.0)
            .ok_or(VerbsError::UnknownMw(mw))?;
        // SAFETY: a live window, removed from the map, deallocated once
        // (which also unbinds it).
        check("ibv_dealloc_mw", unsafe { ibv_dealloc_mw(w.mw) })
    }

    fn post_bind(
        &mut self,
        qp: QpId,
        wr_id: u64,
        mw: MwId,
        mr: &Mr,
        span: WindowSpan,
    ) -> Result<u32, VerbsError> {
        let region = self
            .regions
            .get(&mr.id)
            .ok_or(VerbsError::UnknownMr(mr.id))?
            .mr;
        let w = self.windows.get(&mw.0).ok_or(VerbsError::UnknownMw(mw))?;
        let (raw, rkey) = (w.mw, next_rkey(w.rkey));
        let mut flags = 0u32;
        if span.access.contains(Access::REMOTE_WRITE) {
            flags |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        }
        let mut wr = IbvNic::send_wr(wr_id, ibv_wr_opcode::IBV_WR_BIND_MW);
        wr.bind_mw_tso_union.bind_mw = bind_mw_t {
            mw: raw,
            rkey,
            bind_info: ibv_mw_bind_info {
                mr: region,
                addr: span.addr,
                length: span.len,
                mw_access_flags: flags,
            },
        };
        self.post(qp, &mut wr)?;
        // A type 2 bind posted this way leaves `mw->rkey` as it was: the
        // key is ours to remember.
        if let Some(w) = self.windows.get_mut(&mw.0) {
            w.rkey = rkey;
        }
        Ok(rkey)
    }

    fn post_invalidate(&mut self, qp: QpId, wr_id: u64, rkey: u32) -> Result<(), VerbsError> {
        let mut wr = IbvNic::send_wr(wr_id, ibv_wr_opcode::IBV_WR_LOCAL_INV);
        wr.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
        self.post(qp, &mut wr)
    }

    fn poll_cq(&mut self, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize, VerbsError> {
        const BATCH: usize = 64;
        // SAFETY: all-zero is a valid ibv_wc.
        let mut wcs: [ibv_wc; BATCH] = unsafe { std::mem::zeroed() };
        let want = max.min(BATCH) as i32;
        // SAFETY: `cq` is live and `wcs` has room for `want` entries.
        let n = unsafe { ibv_poll_cq(self.cq, want, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(VerbsError::Os {
                call: "ibv_poll_cq",
                errno: errno(),
            });
        }
        for wc in &wcs[..n as usize] {
            let status = match wc.status {
                ibv_wc_status::IBV_WC_SUCCESS => WcStatus::Success,
                ibv_wc_status::IBV_WC_LOC_LEN_ERR => WcStatus::LocalLength,
                ibv_wc_status::IBV_WC_LOC_PROT_ERR => WcStatus::LocalProtection,
                ibv_wc_status::IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
                ibv_wc_status::IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccess,
                ibv_wc_status::IBV_WC_MW_BIND_ERR => WcStatus::MwBind,
                ibv_wc_status::IBV_WC_REM_INV_REQ_ERR => WcStatus::RemoteInvalidRequest,
                ibv_wc_status::IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExceeded,
                ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExceeded,
                other => WcStatus::Other(other),
            };
            // The opcode is defined only on success; the driver reads it
            // only then.
            let opcode = match wc.opcode {
                ibv_wc_opcode::IBV_WC_RDMA_WRITE => Opcode::Write,
                ibv_wc_opcode::IBV_WC_BIND_MW => Opcode::Bind,
                ibv_wc_opcode::IBV_WC_LOCAL_INV => Opcode::LocalInvalidate,
                o if o & ibv_wc_opcode::IBV_WC_RECV != 0 => Opcode::Recv,
                _ => Opcode::Send,
            };
            out.push(WorkCompletion {
                wr_id: wc.wr_id,
                qp: QpId(wc.qp_num),
                opcode,
                status,
                byte_len: wc.byte_len,
            });
        }
        Ok(n as usize)
    }

    fn completion_fd(&self) -> Option<BorrowedFd<'_>> {
        // SAFETY: the channel's descriptor (opened with the channel in
        // `open`, which fails without it) stays open for as long as
        // `self`, which the borrow cannot outlive.
        Some(unsafe { BorrowedFd::borrow_raw(self.channel_fd) })
    }

    fn arm(&mut self) -> Result<(), VerbsError> {
        self.ack_events();
        // SAFETY: `cq` is live; notify on the next completion of any kind.
        check("ibv_req_notify_cq", unsafe {
            ibv_req_notify_cq(self.cq, 0)
        })
    }
}
