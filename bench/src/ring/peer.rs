//! The peer process: attaches to the parent's shared memory and consumes
//! (throughput runs) or echoes (ping-pong).

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use granary_shm::layout::{BatchDescriptor, ReleaseDescriptor};
use granary_shm::ring::{Consumer, Producer};
use granary_shm::segment::LoaderSegment;

use super::scenario::{absorb, baseline_attach, second_ring_offset, Kind};
use super::{Result, LONG_SPIN, NO_CPU, PING_CAPACITY, SAMPLE_EVERY, TIMEOUT};
use crate::baseline::{self, Tuning};
use crate::cpu::{current_cpu, CpuSamples};
use crate::peer;

pub fn arg(args: &[String], i: usize) -> Result<&str> {
    args.get(i)
        .map(String::as_str)
        .ok_or_else(|| format!("peer: missing argument {i}").into())
}

pub fn run_peer(args: &[String]) -> Result<()> {
    let role = arg(args, 0)?;
    let kind = Kind::parse(arg(args, 1)?)?;
    peer::with_shared_fd(|fd| match role {
        "tp" => {
            let n: u64 = arg(args, 2)?.parse()?;
            let pop: usize = arg(args, 3)?.parse()?;
            let epoch: u64 = arg(args, 4)?.parse()?;
            match kind {
                Kind::Granary => consume_granary(fd, epoch, n, pop),
                Kind::Baseline(_) | Kind::MinRing => {
                    let tuning = kind.baseline().ok_or("not a baseline ring")?;
                    consume_baseline(fd, n, pop, arg(args, 5)?.parse()?, tuning)
                }
            }
        }
        "pp" => {
            let parked = arg(args, 2)? == "parked";
            let total: usize = arg(args, 3)?.parse()?;
            let epoch: u64 = arg(args, 4)?.parse()?;
            let cpu_every: usize = arg(args, 5)?.parse()?;
            match kind {
                Kind::Granary => echo_granary(fd, epoch, parked, total, cpu_every),
                Kind::Baseline(_) | Kind::MinRing => echo_baseline(fd, total, cpu_every),
            }
        }
        _ => Err(format!("peer: unknown role {role}").into()),
    })
}

pub fn attach_granary(
    fd: BorrowedFd<'_>,
    epoch: u64,
) -> Result<(Consumer<BatchDescriptor>, Producer<ReleaseDescriptor>)> {
    let mut seg = LoaderSegment::attach_fd(fd, Some(epoch))?;
    Ok(seg.take_endpoints().ok_or("endpoints already taken")?)
}

pub fn say_done(sum: u64, ok: bool, empty_polls: u64, cpus: &CpuSamples) -> Result<()> {
    peer::say(&[
        "done",
        &sum.to_string(),
        if ok { "1" } else { "0" },
        &empty_polls.to_string(),
        &cpus.encode(),
    ])?;
    Ok(())
}

/// The consumer's loop of a throughput run, the same for both rings: says
/// `ready`, takes up to `pop` descriptors at a time from `cons` with
/// `pop_into` until `n` have arrived (calling `wait` when none was there),
/// sampling the CPU every [`SAMPLE_EVERY`], then says `done`.
#[inline(always)]
fn consume<C>(
    n: u64,
    pop: usize,
    cons: &mut C,
    pop_into: impl Fn(&mut C, &mut [BatchDescriptor]) -> Result<usize>,
    wait: impl Fn(&mut C) -> Result<()>,
) -> Result<()> {
    let mut buf = vec![BatchDescriptor::default(); pop];
    let mut cpus = CpuSamples::default();
    cpus.sample();
    peer::say(&["ready"])?;
    let (mut next, mut sum, mut ok, mut polls) = (0u64, 0u64, true, 0u64);
    let mut sample_at = SAMPLE_EVERY;
    while next < n {
        let got = pop_into(cons, &mut buf)?;
        if got == 0 {
            polls += 1;
            wait(cons)?;
            continue;
        }
        ok &= absorb(&buf[..got], &mut next, &mut sum);
        if next >= sample_at {
            cpus.sample();
            sample_at += SAMPLE_EVERY;
        }
    }
    say_done(sum, ok && next == n, polls, &cpus)
}

// Kept out of line so both rings' loops are compiled on equal terms.
#[inline(never)]
pub fn consume_granary(fd: BorrowedFd<'_>, epoch: u64, n: u64, pop: usize) -> Result<()> {
    let (mut cons, _release) = attach_granary(fd, epoch)?;
    consume(
        n,
        pop,
        &mut cons,
        |cons, buf| Ok(cons.pop_into(buf)?),
        |cons| match cons.wait_for_data(Some(TIMEOUT))? {
            true => Ok(()),
            false => Err("granary ring: producer stalled".into()),
        },
    )
}

// Kept out of line so both rings' loops are compiled on equal terms.
#[inline(never)]
pub fn consume_baseline(
    fd: BorrowedFd<'_>,
    n: u64,
    pop: usize,
    cap: usize,
    tuning: Tuning,
) -> Result<()> {
    let region = baseline_attach(fd)?;
    // SAFETY: the parent created the zeroed ring and its only producer; this
    // is the only consumer.
    let mut cons = unsafe { baseline::consumer::<BatchDescriptor>(region, 0, cap) }.tuned(tuning);
    let deadline = Instant::now() + TIMEOUT * 30;
    consume(
        n,
        pop,
        &mut cons,
        |cons, buf| Ok(cons.pop_into(buf)),
        |cons| Ok(cons.wait_for_data(deadline)?),
    )
}

pub fn cpu_word() -> u64 {
    current_cpu().map_or(NO_CPU, u64::from)
}

pub fn echo_granary(
    fd: BorrowedFd<'_>,
    epoch: u64,
    parked: bool,
    total: usize,
    cpu_every: usize,
) -> Result<()> {
    let (mut ping, mut pong) = attach_granary(fd, epoch)?;
    let spin = if parked { Duration::ZERO } else { LONG_SPIN };
    ping.set_spin(spin);
    pong.set_spin(spin);
    peer::say(&["ready"])?;
    let mut cpu = NO_CPU;
    for i in 0..total {
        let d = ping.pop_blocking(Some(TIMEOUT))?;
        let r = ReleaseDescriptor {
            seq: d.seq,
            token: std::mem::replace(&mut cpu, NO_CPU),
        };
        if !pong.try_push(r)? {
            return Err("pong ring full".into());
        }
        // Sampled after the pong left, so the read stays out of the timed path;
        // it travels with the next pong.
        if i % cpu_every == 0 {
            cpu = cpu_word();
        }
    }
    peer::say(&["done"])?;
    Ok(())
}

pub fn echo_baseline(fd: BorrowedFd<'_>, total: usize, cpu_every: usize) -> Result<()> {
    let region = baseline_attach(fd)?;
    let cap = PING_CAPACITY as usize;
    let second = second_ring_offset::<BatchDescriptor>(cap);
    // SAFETY: the parent created the zeroed rings and owns the other ends;
    // this is the only consumer of ring 0 ...
    let mut ping = unsafe { baseline::consumer::<BatchDescriptor>(region.clone(), 0, cap) };
    // SAFETY: ... and the only producer of ring 1.
    let mut pong = unsafe { baseline::producer::<ReleaseDescriptor>(region, second, cap) };
    peer::say(&["ready"])?;
    let deadline = Instant::now() + TIMEOUT * 30;
    let mut one = [BatchDescriptor::default()];
    let mut cpu = NO_CPU;
    for i in 0..total {
        while ping.pop_into(&mut one) == 0 {
            ping.wait_for_data(deadline)?;
        }
        let r = ReleaseDescriptor {
            seq: one[0].seq,
            token: std::mem::replace(&mut cpu, NO_CPU),
        };
        pong.push_batch(1, deadline, |_| r)?;
        if i % cpu_every == 0 {
            cpu = cpu_word();
        }
    }
    peer::say(&["done"])?;
    Ok(())
}
