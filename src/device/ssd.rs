//! `ssd`: a NAND SSD with a page-mapped FTL (`device::ftl`), channels × dies, read /
//! program / erase latencies, channel transfer time, a host link, over-provisioning and
//! greedy GC. GC relocations and erases occupy the same dies as host I/O, which is how
//! one tenant's random writes slow every other tenant on an aged drive.
//!
//! Timing is a resource-reservation model: each die keeps the time it is next free and a
//! request's pages are scheduled on their dies in submission order; the request completes
//! when its last page (and its host transfer) does. The controller takes one command
//! every `command_us` and passes it on after `command_latency_us` (a pipelined
//! controller when that is shorter); write data follows on the inbound link page by
//! page. Transfers whose data is ready only later (a read's page after its die, read
//! data back to the host) are charged to a per-channel / outbound *virtual clock* that
//! starts at submission: it caps the rate, but a transfer never waits behind one
//! reserved further in the future, which would otherwise stall a write on an idle die
//! behind a read queued on a busy one.
//!
//! With a write-back buffer, a write is acknowledged once its pages hold slots, and
//! reads go ahead of the buffered programs queued on their die (waiting for the
//! operation in progress: one program, or an erase they arrive during). Optional read
//! units sense several 4 KiB pages at once into a die's page register, which a
//! sequential reader then reads without sensing again. Readings and the measurements
//! that chose them are in `docs/devices.md`; the presets' sources are the drives'
//! datasheets.
//!
//! A write that covers a page only in part (a 512 B write, or an unaligned one) reads the
//! page first and programs the merged page (read-modify-write), unless the page holds no
//! data yet: the FTL maps 4 KiB, so a sub-page write costs a page read and a page program.
//!
//! Latencies are *effective per 4 KiB mapping page*: a real drive programs 8–48 KiB per
//! die operation (multi-plane, multi-level pages); dividing that operation's time by the
//! 4 KiB units it carries keeps sequential and random throughput at the datasheet
//! figures while the FTL works in 4 KiB pages.

use super::ftl::{Ftl, Geometry, PAGE_BYTES};
use super::{DeviceModel, DeviceStats, Submitted, write_amplification};
use crate::types::{NANOS_PER_SEC, Nanos, Op, Request};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Erases remembered per die for reads that arrive during one (older ones are dropped).
const ERASES_KEPT: usize = 32;

/// Every parameter of the SSD model. A preset fills them; a scenario may override any.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SsdParams {
    /// User-visible capacity in GiB (scale a preset down to simulate faster; GC
    /// behaviour depends on over-provisioning and fill, not on absolute size).
    pub capacity_gib: f64,
    /// Extra physical space as a fraction of the logical space.
    pub op_ratio: f64,
    /// Flash channels (buses) between the controller and the dies.
    pub channels: u32,
    /// Dies on each channel.
    pub dies_per_channel: u32,
    /// Erase block size in 4 KiB pages.
    pub pages_per_block: u32,
    /// Effective read time of a 4 KiB page on a die, microseconds.
    pub read_us: f64,
    /// Effective program time of a 4 KiB page on a die, microseconds.
    pub program_us: f64,
    /// Block erase time, microseconds.
    pub erase_us: f64,
    /// Flash channel (bus) bandwidth, MB/s.
    pub channel_mb_s: f64,
    /// Host interface bandwidth (SATA / PCIe), MB/s.
    pub host_mb_s: f64,
    /// Controller time per command, microseconds: commands are taken one after another,
    /// one every `command_us` (what caps small random I/O).
    pub command_us: f64,
    /// How long a command takes to reach the flash (or, for a write, the link) after
    /// the controller takes it, microseconds. Absent: `command_us`, a controller that
    /// finishes one command before it starts the next. Less than `command_us`: a
    /// pipelined controller whose per-command work (mapping updates, completion
    /// handling) partly follows the command, so one command alone is faster than the
    /// rate commands can be taken at. Every preset sets it (a scenario can override
    /// only what its preset has).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_latency_us: Option<f64>,
    /// GC runs on a die when its free pool drops below this many blocks.
    pub gc_threshold_blocks: u32,
    /// Write-back buffer in MiB (0: none, a write completes when programmed). With a
    /// buffer a write completes once its pages hold a buffer slot; a slot frees when its
    /// page is programmed, and a flush waits until every buffered page is. Reads go
    /// ahead of the buffered pages queued on their die: a read waits for the operation
    /// in progress only — an erase it arrives during, otherwise one program
    /// (`program_us`), nothing right behind another read — and the queued work ends
    /// later by the read. Readings: a relocation in progress counts as one program;
    /// a read 1 ns after the die's last read ended counts as arriving during a program;
    /// slot times already answered keep theirs (a flush waits for the dies' queues).
    #[serde(default)]
    pub write_buffer_mib: f64,
    /// With a write buffer, the time from a write's last page taking its slot to the
    /// acknowledgement, microseconds (firmware bookkeeping; 0: at once). It delays the
    /// write's completion only, nothing waits on it; without a buffer it does nothing
    /// (a write completes when programmed).
    #[serde(default)]
    pub write_ack_us: f64,
    /// 4 KiB pages one read sensing brings into a die's page register (a 16 KiB NAND
    /// page holds 4). A read of a page whose unit is still in its die's register (the
    /// die's last operation sensed it) needs only the channel transfer: sequential
    /// reads get the die's full page rate, random 4 KiB reads do not. Default 1.
    #[serde(default = "one")]
    pub read_unit_pages: u32,
    /// The host link carries one direction at a time (SATA, SAS): read and write data
    /// share `host_mb_s` together. `false`: a full-duplex link (PCIe), `host_mb_s` each
    /// way.
    #[serde(default)]
    pub half_duplex: bool,
    /// Program/erase suspend for reads, microseconds (0: none, a read waits behind the
    /// programs and erases queued on its die). With it, a read that finds its die busy
    /// for longer than this suspends the work, is served after this long, and the work
    /// queued on the die ends that much (and the read) later. Readings: completions
    /// already reported (an unbuffered write's) keep their time, the delay falls on the
    /// work queued after the read; and suspends are not capped per program, so reads
    /// faster than one per (suspend + read) on a die hold its programs and GC back.
    #[serde(default)]
    pub read_suspend_us: f64,
}

fn one() -> u32 {
    1
}

/// A named preset: parameters and where they came from.
pub struct SsdPreset {
    /// Name a scenario selects it by.
    pub name: &'static str,
    /// The drive it models, in one line.
    pub description: &'static str,
    /// Its parameters.
    pub params: SsdParams,
}

/// The shipped presets. Derivations are in `docs/devices.md`.
pub fn presets() -> &'static [SsdPreset] {
    &[
        SsdPreset {
            name: "sata-840pro",
            description: "256 GB SATA MLC SSD of the Samsung 840 Pro class (MCFQ paper)",
            params: SsdParams {
                capacity_gib: 238.4, // 256 GB (10^9) user capacity
                op_ratio: 0.0737,    // 256 GiB of NAND behind 256 GB
                channels: 8,
                dies_per_channel: 4,  // 32 × 64 Gbit MLC dies
                pages_per_block: 512, // 2 MiB blocks
                read_us: 70.0,        // QD1 4 KiB read ≈ 100 µs with command, channel and link
                program_us: 250.0,    // 32 dies × 4 KiB / 250 µs ≈ 524 MB/s sequential write
                erase_us: 3000.0,
                channel_mb_s: 400.0, // Toggle DDR 2.0
                host_mb_s: 550.0,    // SATA 6 Gb/s payload, one direction at a time
                command_us: 10.5,    // caps 4 KiB random I/O near 95K IOPS (datasheet 100K/90K)
                gc_threshold_blocks: 3,
                write_buffer_mib: 8.0, // DRAM write-back (assumed size)
                half_duplex: true,
                read_suspend_us: 0.0,
                command_latency_us: Some(12.0),
                write_ack_us: 10.5, // QD1 4 KiB write ≈ 30 µs
                read_unit_pages: 1,
            },
        },
        SsdPreset {
            name: "nvme-p4500",
            description: "1 TB TLC datacenter NVMe SSD of the Intel DC P4500 class (FeedBAC paper)",
            params: SsdParams {
                capacity_gib: 931.3, // 1 TB (10^12) user capacity
                op_ratio: 0.17,      // steady-state 4 KiB random write ≈ 30.5K IOPS (assumed spare)
                channels: 12,
                dies_per_channel: 2,   // 24 read/program units
                pages_per_block: 1024, // 4 MiB blocks
                read_us: 77.0,         // QD1 4 KiB random read 85 µs with overheads
                program_us: 164.0,     // 24 × 4 KiB / 164 µs ≈ 600 MB/s sequential write
                erase_us: 5000.0,
                channel_mb_s: 800.0,
                host_mb_s: 3200.0, // PCIe 3.0 ×4
                command_us: 1.5,
                gc_threshold_blocks: 3,
                write_buffer_mib: 16.0, // power-loss-protected DRAM (assumed size)
                half_duplex: false,
                read_suspend_us: 0.0,
                command_latency_us: Some(1.5),
                write_ack_us: 17.0, // QD1 4 KiB write ≈ 20 µs
                read_unit_pages: 4, // 16 KiB TLC pages: sequential reads at 3.2 GB/s
            },
        },
        SsdPreset {
            name: "intel-x25m",
            description: "80 GB SATA 3 Gb/s MLC SSD of the Intel X25-M G2 class (SSD-analysis paper)",
            params: SsdParams {
                capacity_gib: 74.5, // 80 GB (10^9) user capacity
                op_ratio: 0.0737,   // 80 GiB of NAND behind 80 GB
                channels: 10,
                dies_per_channel: 2,  // 20 × 32 Gbit 34 nm MLC dies
                pages_per_block: 128, // 512 KiB blocks
                read_us: 35.0,        // QD1 4 KiB read 65 µs with command, channel and link
                program_us: 1170.0,   // 20 dies × 4 KiB / 1170 µs ≈ 70 MB/s sequential write
                erase_us: 2000.0,
                channel_mb_s: 400.0,
                host_mb_s: 265.0, // SATA 3 Gb/s payload, one direction at a time
                command_us: 28.0, // caps 4 KiB random reads near 35K IOPS
                gc_threshold_blocks: 3,
                write_buffer_mib: 0.25, // the controller's buffer (assumed)
                half_duplex: true,
                read_suspend_us: 0.0,
                command_latency_us: Some(5.0),
                write_ack_us: 64.5, // QD1 4 KiB write 85 µs
                read_unit_pages: 1,
            },
        },
    ]
}

/// Looks a preset up by name.
pub fn preset(name: &str) -> Option<&'static SsdPreset> {
    presets().iter().find(|p| p.name == name)
}

/// Preconditioning state of a simulated SSD.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precondition {
    /// Fresh from the factory: nothing mapped, every block free.
    Clean,
    /// Whole logical space written, then random overwrites until greedy GC is in steady
    /// state.
    Aged,
}

/// Random overwrites used by aging, as multiples of the logical space.
pub const DEFAULT_AGING_PASSES: f64 = 1.0;

/// An empty page register.
const NO_UNIT: u64 = u64::MAX;

fn ns(us: f64) -> Nanos {
    (us * 1000.0).round() as Nanos
}

fn transfer_ns(bytes: u64, mb_s: f64) -> Nanos {
    (bytes as f64 * NANOS_PER_SEC as f64 / (mb_s * 1e6)).round() as Nanos
}

/// The SSD model: FTL state plus the timelines of dies, channels and the host link.
#[derive(Debug, Clone)]
pub struct SsdDevice {
    params: SsdParams,
    ftl: Ftl,
    read_ns: Nanos,
    program_ns: Nanos,
    erase_ns: Nanos,
    move_ns: Nanos,
    page_xfer_ns: Nanos,
    command_ns: Nanos,
    command_latency_ns: Nanos,
    write_ack_ns: Nanos,
    host_page_ns: Nanos,
    channels: u32,
    die_free: Vec<Nanos>,
    /// Per die, when its last read is done (reads are served one after another, and
    /// with suspend they go ahead of the programs and erases in `die_free`).
    die_read_free: Vec<Nanos>,
    suspend_ns: Nanos,
    /// Per die, the read unit its page register holds and when its sensing is done
    /// (`NO_UNIT`: none; any program, relocation or erase on the die clears it).
    register: Vec<(u64, Nanos)>,
    unit_pages: u32,
    /// Per die, the erases queued on it (start, end), oldest first: a read that goes
    /// ahead of buffered work still waits for an erase it arrives during.
    erasing: Vec<VecDeque<(Nanos, Nanos)>>,
    /// The controller: when it takes its next command.
    ctrl_free: Nanos,
    /// Per channel, a virtual clock of transfers in submission order (see `host_out_clock`).
    channel_clock: Vec<Nanos>,
    /// Inbound link (write data on a full-duplex link), in submission order.
    host_in_free: Nanos,
    /// Outbound link (read data) as a virtual clock: it advances by each read's
    /// transfer from the read's command time, so it caps the read data rate without
    /// making a read whose flash finished early wait behind an earlier, slower one.
    host_out_clock: Nanos,
    /// Write-back buffer slots (4 KiB pages); 0 without a buffer.
    buffer_slots: usize,
    /// Program completion times of the pages holding buffer slots (min-heap).
    buffer: BinaryHeap<Reverse<Nanos>>,
    /// When the last buffered page is programmed (what a flush waits for).
    buffer_drained: Nanos,
    /// Pages read for a read-modify-write (writes that cover a mapped page in part).
    rmw_reads: u64,
}

impl SsdDevice {
    /// A clean drive.
    pub fn new(params: SsdParams) -> Self {
        let logical_pages = (params.capacity_gib * (1u64 << 30) as f64 / PAGE_BYTES as f64) as u32;
        let dies = params.channels * params.dies_per_channel;
        let geo = Geometry::new(
            logical_pages,
            params.op_ratio,
            dies,
            params.pages_per_block,
            params.gc_threshold_blocks,
        );
        let read_ns = ns(params.read_us);
        let program_ns = ns(params.program_us);
        SsdDevice {
            params,
            ftl: Ftl::new(geo),
            read_ns,
            program_ns,
            erase_ns: ns(params.erase_us),
            // Copy-back inside the die: read then program, no channel transfer.
            move_ns: read_ns + program_ns,
            page_xfer_ns: transfer_ns(PAGE_BYTES, params.channel_mb_s),
            command_ns: ns(params.command_us),
            command_latency_ns: ns(params.command_latency_us.unwrap_or(params.command_us)),
            write_ack_ns: ns(params.write_ack_us),
            host_page_ns: transfer_ns(PAGE_BYTES, params.host_mb_s),
            channels: params.channels,
            die_free: vec![0; dies as usize],
            die_read_free: vec![0; dies as usize],
            suspend_ns: ns(params.read_suspend_us),
            register: vec![(NO_UNIT, 0); dies as usize],
            unit_pages: params.read_unit_pages.max(1),
            erasing: vec![VecDeque::new(); dies as usize],
            ctrl_free: 0,
            channel_clock: vec![0; params.channels as usize],
            host_in_free: 0,
            host_out_clock: 0,
            buffer_slots: (params.write_buffer_mib * (1u64 << 20) as f64 / PAGE_BYTES as f64)
                as usize,
            buffer: BinaryHeap::new(),
            buffer_drained: 0,
            rmw_reads: 0,
        }
    }

    /// Brings the drive to a preconditioning state (aging is deterministic per seed).
    pub fn precondition(&mut self, state: Precondition, aging_passes: f64, seed: u64) {
        if state == Precondition::Aged {
            self.ftl.age(aging_passes, seed);
        }
    }

    /// The parameters the drive was built with.
    pub fn params(&self) -> &SsdParams {
        &self.params
    }

    /// The drive's mapping state.
    pub fn ftl(&self) -> &Ftl {
        &self.ftl
    }

    fn pages(&self, request: &Request) -> std::ops::Range<u32> {
        let first = request.offset / PAGE_BYTES;
        let end = (request.offset + request.len.max(1) as u64).div_ceil(PAGE_BYTES);
        let max = self.ftl.geometry().logical_pages as u64;
        first.min(max) as u32..end.min(max) as u32
    }

    #[inline]
    fn channel_of(&self, die: u32) -> usize {
        (die % self.channels) as usize
    }

    /// The read unit a page belongs to: its physical page's, or for a page never
    /// written, the fixed stripe's (kept apart from physical units by the top bit).
    #[inline]
    fn read_unit(&self, lpn: u32) -> u64 {
        let unit = self.unit_pages as u64;
        match self.ftl.lookup(lpn) {
            Some(ppn) => ppn as u64 / unit,
            None => (1 << 63) | (lpn as u64 / self.ftl.geometry().dies as u64 / unit),
        }
    }

    /// Reads one page: die busy for the read (unless its unit is in the die's page
    /// register), then the page crosses its channel.
    #[inline]
    fn read_page(&mut self, lpn: u32, at: Nanos) -> Nanos {
        let die = self.ftl.read_die(lpn);
        let ch = self.channel_of(die);
        let i = die as usize;
        let unit = if self.unit_pages > 1 {
            self.read_unit(lpn)
        } else {
            NO_UNIT
        };
        if unit != NO_UNIT && self.register[i].0 == unit {
            // Sensed already: only the transfer out of the register.
            let sensed = self.register[i].1;
            let c = &mut self.channel_clock[ch];
            *c = (*c).max(at) + self.page_xfer_ns;
            return (sensed.max(at) + self.page_xfer_ns).max(*c);
        }
        let start = at.max(self.die_read_free[i]);
        let busy = self.die_free[i].saturating_sub(start);
        let read_done = if self.suspend_ns > 0
            && busy > self.suspend_ns
            && (self.buffer_slots == 0 || self.suspend_ns < self.program_ns)
        {
            // The die is programming or erasing past the suspend time: suspend it, read,
            // resume; what is queued on it ends later by the suspend and the read.
            let done = start + self.suspend_ns + self.read_ns;
            self.die_free[i] += self.suspend_ns + self.read_ns;
            done
        } else if self.buffer_slots > 0 && busy > self.program_ns {
            // Buffered pages wait in the buffer until their die takes them: a read goes
            // ahead of them and waits for the operation in progress only: an erase it
            // arrives during, otherwise one program (a page relocation is about as
            // long), none when the die is reading (a read right behind another). What
            // is queued ends later by the read.
            let erasing = &mut self.erasing[i];
            while erasing.front().is_some_and(|&(_, end)| end <= start) {
                erasing.pop_front();
            }
            let erase_end = erasing
                .iter()
                .find(|&&(from, end)| from <= start && start < end)
                .map(|&(_, end)| end);
            let in_progress = if self.die_read_free[i] > 0 && self.die_read_free[i] >= at {
                0
            } else if let Some(end) = erase_end {
                end - start
            } else {
                self.program_ns
            };
            let done = start + in_progress + self.read_ns;
            // The erases queued after the read start later by it.
            for e in self.erasing[i]
                .iter_mut()
                .filter(|e| e.0 >= done - self.read_ns)
            {
                e.0 += self.read_ns;
                e.1 += self.read_ns;
            }
            self.die_free[i] += self.read_ns;
            done
        } else {
            let done = self.die_free[i].max(start) + self.read_ns;
            self.die_free[i] = done;
            done
        };
        self.die_read_free[i] = read_done;
        self.register[i] = (unit, read_done);
        let c = &mut self.channel_clock[ch];
        *c = (*c).max(at) + self.page_xfer_ns;
        (read_done + self.page_xfer_ns).max(*c)
    }

    /// Writes one page: the die first runs any GC the allocation needed, the page
    /// crosses its channel, then the die programs it. The page is there from `at`; its
    /// channel transfer is charged to the channel's virtual clock from `charged_from`
    /// (when its data would have crossed the link had it not waited for a buffer slot,
    /// earlier than `at` for a page that did: charging it at the slot's time would push
    /// the clock past the reads in between and make them wait for a transfer still in
    /// the future).
    #[inline]
    fn write_page(&mut self, lpn: u32, at: Nanos, charged_from: Nanos) -> Nanos {
        let work = self.ftl.write(lpn);
        let die = work.die as usize;
        self.register[die] = (NO_UNIT, 0);
        if work.moved > 0 || work.erased > 0 {
            let moves = work.moved as Nanos * self.move_ns;
            let erases = work.erased as Nanos * self.erase_ns;
            let from = self.die_free[die].max(at);
            self.die_free[die] = from + moves + erases;
            if erases > 0 {
                let erasing = &mut self.erasing[die];
                if erasing.len() == ERASES_KEPT {
                    erasing.pop_front();
                }
                erasing.push_back((from + moves, from + moves + erases));
            }
        }
        let ch = self.channel_of(work.die);
        let c = &mut self.channel_clock[ch];
        *c = (*c).max(charged_from) + self.page_xfer_ns;
        let xfer_done = (*c).max(at + self.page_xfer_ns);
        let d = &mut self.die_free[die];
        let done = (*d).max(xfer_done) + self.program_ns;
        *d = done;
        done
    }
}

impl SsdDevice {
    /// The controller takes a command at `now` or when it is next free, one every
    /// `command_us`; answers when the command is through it (`command_latency_us`).
    #[inline]
    fn command(&mut self, now: Nanos) -> Nanos {
        let taken = self.ctrl_free.max(now);
        self.ctrl_free = taken + self.command_ns;
        taken + self.command_latency_ns
    }

    /// Accepts a request at `now` and answers when it finishes.
    pub fn serve(&mut self, request: &Request, now: Nanos) -> Nanos {
        let pages = self.pages(request);
        let npages = (pages.end - pages.start) as Nanos;
        match request.op {
            Op::Read => {
                let start = self.command(now);
                let mut last = start;
                for lpn in pages {
                    last = last.max(self.read_page(lpn, start));
                }
                // Data returns over the host link after the flash has it, no faster than
                // the link carries it.
                let xfer = npages * self.host_page_ns;
                self.host_out_clock = self.host_out_clock.max(start) + xfer;
                (last + xfer).max(self.host_out_clock)
            }
            Op::Write => {
                // The data crosses the host link once the controller has taken the
                // command, page by page. On a half-duplex link it shares the clock read
                // data leaves by; on a full-duplex one it has the inbound direction, in
                // order. The link's clock is charged as if no page waited (`link`):
                // with a buffer a page crosses only once it has a slot (flow control),
                // so a write larger than the buffer streams in as the buffer drains
                // (`arrived`), but while it waits the link carries other commands'
                // data (NCQ), so the wait is not charged to the link or the channels.
                let command = self.command(now);
                let mut link = if self.params.half_duplex {
                    self.host_out_clock
                } else {
                    self.host_in_free
                }
                .max(command);
                let mut arrived = link;
                let mut last = link;
                let (first, end) = (pages.start, pages.end);
                let head_cut = !request.offset.is_multiple_of(PAGE_BYTES);
                let tail_cut = !(request.offset + request.len as u64).is_multiple_of(PAGE_BYTES);
                for lpn in pages {
                    let slot_free =
                        if self.buffer_slots > 0 && self.buffer.len() >= self.buffer_slots {
                            self.buffer.pop().map_or(0, |Reverse(t)| t)
                        } else {
                            0
                        };
                    link += self.host_page_ns;
                    arrived = (arrived + self.host_page_ns)
                        .max(slot_free + self.host_page_ns)
                        .max(link);
                    // A page the write covers only in part is read first and merged
                    // (read-modify-write), unless it holds no data yet; the old page is
                    // read while the new data is on its way.
                    let partial = (lpn == first && head_cut) || (lpn + 1 == end && tail_cut);
                    let ready = if partial && self.ftl.lookup(lpn).is_some() {
                        self.rmw_reads += 1;
                        self.read_page(lpn, link).max(arrived)
                    } else {
                        arrived
                    };
                    let programmed = self.write_page(lpn, ready, link);
                    if self.buffer_slots == 0 {
                        last = last.max(programmed);
                        continue;
                    }
                    // In the buffer the write is acknowledged; the page is programmed in
                    // the background and frees its slot then.
                    self.buffer.push(Reverse(programmed));
                    self.buffer_drained = self.buffer_drained.max(programmed);
                    last = last.max(ready + self.write_ack_ns);
                }
                if self.params.half_duplex {
                    self.host_out_clock = link;
                } else {
                    self.host_in_free = link;
                }
                last
            }
            Op::Trim => {
                for lpn in pages {
                    self.ftl.trim(lpn);
                }
                self.command(now)
            }
            // The FTL's map is the controller's: a lookup costs the command.
            Op::Status => self.command(now),
            // A flush costs the command and waits for the write buffer to drain: for
            // every buffered page's program, which reads that went ahead of it (they
            // move the dies' queues later, not the answered slot times) may have
            // delayed up to the end of its die's queue.
            Op::Flush => {
                let done = self.command(now).max(self.buffer_drained);
                if self.buffer_slots > 0 && self.buffer_drained > now {
                    done.max(self.die_free.iter().copied().max().unwrap_or(0))
                } else {
                    done
                }
            }
        }
    }
}

impl DeviceModel for SsdDevice {
    fn submit(&mut self, request: &Request, now: Nanos) -> Submitted {
        Submitted::Finishes(self.serve(request, now))
    }

    fn check(&self) -> Result<(), String> {
        self.ftl.check_invariants()
    }

    fn stats(&self) -> DeviceStats {
        let c = self.ftl.counters();
        DeviceStats {
            gc_runs: c.gc_runs,
            pages_moved: c.pages_moved,
            write_amplification: write_amplification(c.host_pages_written, c.pages_moved),
            busy_ns: None,
        }
    }

    fn reset_stats(&mut self) {
        self.ftl.reset_counters();
    }

    fn capacity_bytes(&self) -> u64 {
        self.ftl.geometry().logical_pages as u64 * PAGE_BYTES
    }

    fn clone_box(&self) -> Box<dyn DeviceModel> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> SsdParams {
        SsdParams {
            capacity_gib: 1.0 / 64.0, // 16 MiB = 4096 pages
            op_ratio: 0.1,
            channels: 2,
            dies_per_channel: 2,
            pages_per_block: 32,
            read_us: 50.0,
            program_us: 200.0,
            erase_us: 2000.0,
            channel_mb_s: 409.6, // 10 µs per page
            host_mb_s: 4096.0,   // 1 µs per page
            command_us: 5.0,
            gc_threshold_blocks: 2,
            write_buffer_mib: 0.0,
            half_duplex: false,
            read_suspend_us: 0.0,
            command_latency_us: None,
            write_ack_us: 0.0,
            read_unit_pages: 1,
        }
    }

    fn req(op: Op, offset: u64, len: u32) -> Request {
        Request {
            id: 0,
            tenant: 0,
            op,
            offset,
            len,
            arrival: 0,
            cost: 0,
        }
    }

    #[test]
    fn single_page_read_time_is_sum_of_stages() {
        let mut d = SsdDevice::new(tiny());
        // command 5 µs + read 50 µs + channel 10 µs + host 1 µs.
        assert_eq!(d.serve(&req(Op::Read, 0, 4096), 0), 66_000);
    }

    #[test]
    fn single_page_write_time_is_sum_of_stages() {
        let mut d = SsdDevice::new(tiny());
        // command 5 + host 1 + channel 10 + program 200 µs.
        assert_eq!(d.serve(&req(Op::Write, 0, 4096), 0), 216_000);
    }

    #[test]
    fn a_write_to_part_of_a_written_page_reads_it_first() {
        let mut d = SsdDevice::new(tiny());
        // A 512 B write to a page that holds no data yet: a plain page program.
        assert_eq!(d.serve(&req(Op::Write, 512, 512), 0), 216_000);
        assert_eq!(d.rmw_reads, 0);
        // The same page again, now mapped: command 5 + host 1, read 50 + channel 10,
        // then channel 10 + program 200 µs.
        let t = 1_000_000;
        assert_eq!(d.serve(&req(Op::Write, 1024, 512), t) - t, 276_000);
        assert_eq!(d.rmw_reads, 1);
        // Whole pages are never read; a write cut at both ends of two pages reads both.
        let t = 2_000_000;
        assert_eq!(d.serve(&req(Op::Write, 0, 4096), t) - t, 216_000);
        let _ = d.serve(&req(Op::Write, 4096, 4096), t + 1_000_000);
        let _ = d.serve(&req(Op::Write, 2048, 4096), t + 2_000_000);
        assert_eq!(d.rmw_reads, 3);
    }

    /// A half-duplex link carries read and write data one after the other; a full-duplex
    /// one carries both at once. A slow link (100 µs a page) makes it show: a 4-page
    /// write issued while a 4-page read's data leaves waits for it on half duplex only.
    #[test]
    fn a_half_duplex_link_shares_its_time_between_reads_and_writes() {
        let slow = |half_duplex| SsdParams {
            host_mb_s: 40.96, // 100 µs a page
            half_duplex,
            ..tiny()
        };
        let mut full = SsdDevice::new(slow(false));
        let mut half = SsdDevice::new(slow(true));
        for d in [&mut full, &mut half] {
            let _ = d.serve(&req(Op::Write, 0, 4 * 4096), 0);
        }
        let t = 10_000_000;
        // The read: command 5 µs, then its 400 µs of data out from 5 µs (virtual clock).
        let rf = full.serve(&req(Op::Read, 0, 4 * 4096), t) - t;
        let rh = half.serve(&req(Op::Read, 0, 4 * 4096), t) - t;
        assert_eq!(rf, rh);
        // The write right behind it: command at 10 µs; its data crosses at once on full
        // duplex (10 + 400 µs), after the read's (5 + 400 + 400 µs) on half duplex.
        let wf = full.serve(&req(Op::Write, 8 * 4096, 4 * 4096), t) - t;
        let wh = half.serve(&req(Op::Write, 8 * 4096, 4 * 4096), t) - t;
        assert_eq!(wh - wf, 395_000, "full {wf} half {wh}");
    }

    /// Restricting the link never speeds anything up: a burst of writes finishes no
    /// earlier on a half-duplex link than on a full-duplex one.
    #[test]
    fn half_duplex_never_beats_full_duplex() {
        for host_mb_s in [4096.0, 40.96] {
            let run = |half_duplex| {
                let mut d = SsdDevice::new(SsdParams {
                    host_mb_s,
                    half_duplex,
                    ..tiny()
                });
                (0..64u64)
                    .map(|i| d.serve(&req(Op::Write, i * 4096, 4096), 0))
                    .max()
                    .unwrap()
            };
            assert!(run(true) >= run(false), "{host_mb_s} MB/s");
            assert_eq!(run(true), run(false), "writes alone use one direction");
        }
    }

    /// Without suspend a read waits behind the program on its die; with it, the read is
    /// served after the suspend time and the program ends that much later.
    #[test]
    fn read_suspend_lets_a_read_go_ahead_of_a_program() {
        let run = |suspend_us| {
            let mut d = SsdDevice::new(SsdParams {
                read_suspend_us: suspend_us,
                ..tiny()
            });
            // Pages 1-8 written at 0 (all programmed well before 1 ms), page 0 written
            // from 1 ms: its program runs from 1016 to 1216 µs on some die; at 1050 µs
            // a page already on that die is read.
            let _ = d.serve(&req(Op::Write, 4096, 8 * 4096), 0);
            let w = d.serve(&req(Op::Write, 0, 4096), 1_000_000);
            let die = d.ftl.read_die(0);
            let lpn = (1..=8u64)
                .find(|&l| d.ftl.read_die(l as u32) == die)
                .expect("a page on the same die");
            let r = d.serve(&req(Op::Read, lpn * 4096, 4096), 1_050_000);
            (w, r, d.die_free[die as usize])
        };
        let (w, r, _) = run(0.0);
        assert_eq!(w, 1_216_000);
        // Behind the program: 1216 + read 50 + channel 10 + host 1 µs.
        assert_eq!(r, 1_277_000);
        let (w, r, program_end) = run(20.0);
        assert_eq!(w, 1_216_000);
        // Command 5 µs (1055), suspend 20 + read 50 (1125), channel 10, host 1.
        assert_eq!(r, 1_136_000);
        assert_eq!(program_end, 1_216_000 + 70_000);
    }

    #[test]
    fn pages_on_different_dies_overlap() {
        let mut d = SsdDevice::new(tiny());
        // 4 pages striped over 4 dies on 2 channels: programs overlap. Command 5 µs,
        // then a page a µs on the link (in at 6, 7, 8, 9 µs); channel 0 carries pages 0
        // and 2 (6–16, 16–26 µs), channel 1 pages 1 and 3 (7–17, 17–27 µs): the last
        // page programs from 27 µs to 227 µs.
        let t = d.serve(&req(Op::Write, 0, 4 * 4096), 0);
        assert_eq!(t, 227_000);
    }

    #[test]
    fn write_to_idle_die_does_not_wait_for_reads_queued_on_a_busy_die() {
        let mut d = SsdDevice::new(tiny());
        // Writes go round-robin: A to die 0, B to die 1.
        let a = d.serve(&req(Op::Write, 0, 4096), 0);
        assert_eq!(a, 216_000);
        d.serve(&req(Op::Write, 4096, 4096), 0);
        // Ten reads of unwritten pages 4, 8, … all land on die 0 (channel 0), behind A.
        let mut last_read = 0;
        for k in 1..=10u64 {
            last_read = d.serve(&req(Op::Read, k * 4 * 4096, 4096), 0);
        }
        // Die 0: A programs until 216 µs, then ten 50 µs reads; the last page crosses the
        // channel 10 µs later.
        assert_eq!(last_read, 216_000 + 10 * 50_000 + 10_000 + 1_000);
        // C goes to die 2, also on channel 0. The controller takes its command at
        // 12 × 5 = 60 µs (A, B and the ten reads before it), its data is in at 66 µs;
        // the channel carried A (6–16 µs) and owes the reads ten transfers from their
        // command times (clock at 116 µs), so C crosses at 116–126 µs and programs
        // until 326 µs, long before die 0's reads are done.
        let c = d.serve(&req(Op::Write, 2 * 4096, 4096), 0);
        assert_eq!(c, 326_000);
    }

    #[test]
    fn write_buffer_acknowledges_early_and_flush_waits_for_the_drain() {
        let mut d = SsdDevice::new(SsdParams {
            write_buffer_mib: 2.0 * 4096.0 / (1u64 << 20) as f64, // two pages
            ..tiny()
        });
        // A (die 0) and B (die 1) take the two slots: acknowledged when their data is in
        // (6 µs; B's command is taken at 5 µs, its data in at 11 µs), programmed until
        // 216 and 221 µs.
        assert_eq!(d.serve(&req(Op::Write, 0, 4096), 0), 6_000);
        assert_eq!(d.serve(&req(Op::Write, 4096, 4096), 0), 11_000);
        // C (die 2, channel 0) waits for A's slot (216 µs) before its data crosses the
        // link (until 217 µs), then its channel (227 µs), and programs until 427 µs.
        assert_eq!(d.serve(&req(Op::Write, 2 * 4096, 4096), 0), 217_000);
        // A flush waits for the last buffered page.
        assert_eq!(d.serve(&req(Op::Flush, 0, 0), 0), 427_000);
    }

    /// A pipelined controller: one command every `command_us`, each through it after
    /// `command_latency_us`. A lone read is faster; a burst is paced the same.
    #[test]
    fn a_pipelined_controller_shortens_a_lone_command_not_the_rate() {
        let burst = |latency: Option<f64>| {
            let mut d = SsdDevice::new(SsdParams {
                command_us: 20.0,
                command_latency_us: latency,
                ..tiny()
            });
            let lone = d.serve(&req(Op::Read, 0, 4096), 0);
            // 16 reads of pages on 4 dies at 1 ms: the controller takes one every 20 µs.
            let t = 1_000_000;
            let last = (0..16u64)
                .map(|i| d.serve(&req(Op::Read, i * 4096, 4096), t))
                .max()
                .unwrap();
            (lone, last - t)
        };
        // command 20 + read 50 + channel 10 + host 1 µs.
        assert_eq!(burst(None).0, 81_000);
        assert_eq!(burst(Some(5.0)).0, 66_000);
        // The 16th command is taken at 300 µs either way; its page's die (3) has read
        // pages 3, 7 and 11 from 60 (or 45) µs on, one every 20 µs, so it is free.
        let (_, serial) = burst(None);
        let (_, piped) = burst(Some(5.0));
        assert_eq!(serial, 300_000 + 81_000);
        assert_eq!(piped, 300_000 + 66_000);
    }

    /// A write waiting for buffer slots does not hold the half-duplex link: a read
    /// behind it finishes as it would with a buffer large enough for the whole write.
    #[test]
    fn a_write_waiting_for_slots_does_not_hold_the_link() {
        let read_after = |slots: f64| {
            let mut d = SsdDevice::new(SsdParams {
                host_mb_s: 40.96, // 100 µs a page
                half_duplex: true,
                write_buffer_mib: slots * 4096.0 / (1u64 << 20) as f64,
                ..tiny()
            });
            let w = d.serve(&req(Op::Write, 0, 4 * 4096), 0);
            let r = d.serve(&req(Op::Read, 1 << 20, 4 * 4096), 10_000);
            (w, r)
        };
        let (w_small, r_small) = read_after(2.0);
        let (w_large, r_large) = read_after(64.0);
        // The small buffer's write is acknowledged later (pages 2 and 3 wait for slots)…
        assert!(w_small > w_large, "{w_small} vs {w_large}");
        // …but the read's data leaves on the link's clock as if nothing had waited
        // (the write's 4 pages to 405 µs, then the read's 4), and its pages are ready
        // as early: the same answer.
        assert_eq!(r_small, r_large);
        assert!(r_large >= 405_000 + 400_000, "{r_large}");
    }

    /// A read that goes ahead of buffered programs still waits for an erase it arrives
    /// during, and a flush waits for the dies' queues the reads made longer.
    #[test]
    fn a_read_ahead_of_buffered_programs_waits_for_an_erase_in_progress() {
        let mut d = SsdDevice::new(SsdParams {
            write_buffer_mib: 1.0,
            ..tiny()
        });
        d.erasing[0].push_back((1_000_000, 3_000_000));
        d.die_free[0] = 5_000_000;
        // Page 0 was never written: its die is 0. Arriving at 2 ms, during the erase.
        let r = d.serve(&req(Op::Read, 0, 4096), 2_000_000 - 5_000) - 2_000_000;
        // Command 5 µs, the erase's last 1000 µs, read 50, channel 10, host 1.
        assert_eq!(r, 1_000_000 + 50_000 + 10_000 + 1_000);
        // The queue behind it is 50 µs longer; a later read waits one program only.
        assert_eq!(d.die_free[0], 5_050_000);
        let r = d.serve(&req(Op::Read, 16 * 4096, 4096), 4_000_000) - 4_000_000;
        assert_eq!(d.ftl.read_die(16), 0);
        assert_eq!(r, 5_000 + 200_000 + 50_000 + 10_000 + 1_000);
    }

    /// With a buffer, `write_ack_us` delays the acknowledgement and nothing else.
    #[test]
    fn write_ack_delays_the_acknowledgement_only() {
        let run = |ack_us| {
            let mut d = SsdDevice::new(SsdParams {
                write_buffer_mib: 1.0,
                write_ack_us: ack_us,
                ..tiny()
            });
            let w = d.serve(&req(Op::Write, 0, 4096), 0);
            let f = d.serve(&req(Op::Flush, 0, 0), 0);
            (w, f)
        };
        assert_eq!(run(0.0), (6_000, 216_000));
        assert_eq!(run(30.0), (36_000, 216_000));
    }

    /// With 4-page read units, the pages a sequential write put next to each other on a
    /// die are sensed once: reading them back takes one sensing per unit, random reads
    /// of separate units take one each.
    #[test]
    fn a_read_unit_is_sensed_once_for_its_pages() {
        let read_all = |unit: u32, lpns: &[u64]| {
            let mut d = SsdDevice::new(SsdParams {
                read_unit_pages: unit,
                host_mb_s: 409_600.0, // 0.01 µs a page: the link out of the way
                ..tiny()
            });
            // 64 pages written in order: page l on die l % 4, 16 in a row on each die.
            let _ = d.serve(&req(Op::Write, 0, 64 * 4096), 0);
            let t = 10_000_000;
            let last = lpns
                .iter()
                .map(|&l| d.serve(&req(Op::Read, l * 4096, 4096), t))
                .max()
                .unwrap();
            (last - t, d)
        };
        // Die 0 holds pages 0, 4, 8, … in its block's first 16 slots: units of 4 slots
        // are pages {0, 4, 8, 12}, {16, 20, 24, 28}, …
        let same_unit = [0u64, 4, 8, 12];
        let (one, _) = read_all(1, &same_unit);
        let (four, _) = read_all(4, &same_unit);
        // Unit 1: four sensings on die 0 (50 µs each) — the last done at 5 + 200 µs,
        // then its channel transfer. Unit 4: one sensing done at 55 µs, then the
        // transfers; the channel's virtual clock (from the commands at 5–20 µs) is at
        // 45 µs, below the data, so each is out 10 µs after the sensing. Each then
        // crosses the link in 10 ns.
        assert_eq!(one, 5_000 + 4 * 50_000 + 10_000 + 10);
        assert_eq!(four, 5_000 + 50_000 + 10_000 + 10);
        // Four pages in four different units of die 0: no gain.
        let apart = [0u64, 16, 32, 48];
        assert_eq!(read_all(4, &apart).0, read_all(1, &apart).0);
        // A program on the die empties its register: the unit is sensed again.
        let (_, mut d) = read_all(4, &same_unit);
        let t = 20_000_000;
        let _ = d.serve(&req(Op::Write, 100 * 4096, 4096), t); // round-robin: die 0
        assert_eq!(d.ftl.read_die(100), 0);
        let r = d.serve(&req(Op::Read, 0, 4096), t + 1_000_000) - t - 1_000_000;
        assert_eq!(r, 5_000 + 50_000 + 10_000 + 10);
    }

    #[test]
    fn presets_are_named_and_sane() {
        for p in presets() {
            assert!(preset(p.name).is_some());
            assert!(p.params.op_ratio > 0.0 && p.params.channels > 0);
        }
        assert!(preset("nope").is_none());
    }

    #[test]
    fn aged_drive_is_slower_for_random_writes_than_clean() {
        let mut clean = SsdDevice::new(tiny());
        let mut aged = SsdDevice::new(tiny());
        aged.precondition(Precondition::Aged, 2.0, 7);
        let run = |d: &mut SsdDevice| {
            let mut t = 0;
            for i in 0..4000u64 {
                let off = (i * 2_654_435_761) % 4096 * 4096;
                t = d.serve(&req(Op::Write, off, 4096), t);
            }
            t
        };
        let tc = run(&mut clean);
        let ta = run(&mut aged);
        assert!(ta > tc * 2, "aged {ta} vs clean {tc}");
        assert!(aged.stats().write_amplification > 1.5);
        assert!(aged.stats().gc_runs > 0);
        aged.ftl().check_invariants().unwrap();
    }
}
