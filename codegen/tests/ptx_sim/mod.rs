//! A small PTX simulator for the tests: runs the subset of PTX the PTX
//! printers emit (decode attention, GEMV, and the tensor-core kernels'
//! `ldmatrix`, `mma.sync` m16n8k16 and `cp.async`), one block at a time,
//! threads interleaved at every warp collective (`shfl.sync`, `vote.sync`,
//! `ldmatrix`, `mma`, a guarded `bra.uni`, which must be warp-uniform)
//! and block barrier (`bar.sync`), so the kernels' index math, reductions,
//! fragments and softmax are checked against the reference interpreter
//! without a GPU.
//!
//! Every global access is bounds- and alignment-checked against the buffer
//! its address points into (a test failure, not UB), and every shared
//! access against the block's shared memory. `cp.async` copies land only
//! at the `cp.async.wait_*` that covers their group, so a missing wait
//! reads stale data. Floating point is IEEE f32 as on the GPU (`fma`
//! fused, `div.rn` and `sqrt.rn` correctly rounded); `ex2.approx` is
//! computed exactly (hardware: within 2 ulp), `mma` and the f16x2
//! arithmetic in f64 rounded once.
//!
//! `SIM_TRACE=<tid.x>` prints every instruction thread `(tid.x, 0, 0)` of
//! block `(0, 0, 0)` executes, with the value it wrote.

#![allow(dead_code)]

use std::collections::BTreeMap;

use half::f16;
use tessera_dsl::quant::fp8_e4m3_to_f32;

/// One operand, resolved.
#[derive(Clone, Debug)]
enum Opnd {
    Reg(usize),
    /// `!%p`: a negated predicate.
    NotReg(usize),
    Imm(u64),
    /// `{a, b, ...}`.
    Vec(Vec<usize>),
    /// `[reg + off]` or `[symbol + off]`.
    Mem {
        base: Box<Opnd>,
        off: i64,
    },
    /// A shared array's address or a parameter's name.
    Sym(String),
    Label(String),
}

#[derive(Clone, Debug)]
struct Instr {
    guard: Option<(usize, bool)>,
    op: String,
    args: Vec<Opnd>,
}

/// One `.entry`.
struct Entry {
    params: Vec<String>,
    code: Vec<Instr>,
    labels: BTreeMap<String, usize>,
    regs: usize,
}

/// A parsed module.
pub struct Module {
    entries: BTreeMap<String, Entry>,
    /// Shared arrays: name → (offset, bytes).
    shared: BTreeMap<String, (u32, u32)>,
    shared_bytes: u32,
}

fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            out.push(cur.trim().to_string());
            cur.clear();
        } else {
            cur.push(c);
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

fn int_lit(s: &str) -> Option<u64> {
    if let Some(h) = s.strip_prefix("0f") {
        return u32::from_str_radix(h, 16).ok().map(u64::from);
    }
    if let Some(h) = s.strip_prefix("0x") {
        return u64::from_str_radix(h, 16).ok();
    }
    s.parse::<i64>().ok().map(|v| v as u64)
}

impl Module {
    pub fn parse(text: &str) -> Module {
        let mut entries = BTreeMap::new();
        let mut shared = BTreeMap::new();
        let mut shared_bytes = 0u32;
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let line = lines[i].trim();
            if let Some(decl) = line.strip_prefix(".extern .shared ") {
                // .extern .shared .align A .b8 name[]; sized at launch.
                let f: Vec<&str> = decl.trim_end_matches(';').split_whitespace().collect();
                let align: u32 = f[1].parse().unwrap();
                let name = f[3].trim_end_matches("[]");
                shared_bytes = shared_bytes.div_ceil(align) * align;
                shared.insert(name.to_string(), (shared_bytes, 0));
            } else if let Some(decl) = line.strip_prefix(".shared ") {
                // .shared .align A .T name[N];
                let f: Vec<&str> = decl.trim_end_matches(';').split_whitespace().collect();
                let align: u32 = f[1].parse().unwrap();
                let size = match f[2] {
                    ".f32" | ".u32" | ".b32" => 4,
                    other => panic!("shared type {other}"),
                };
                let (name, n) = f[3].split_once('[').unwrap();
                let n: u32 = n.trim_end_matches(']').parse().unwrap();
                shared_bytes = shared_bytes.div_ceil(align) * align;
                shared.insert(name.to_string(), (shared_bytes, n * size));
                shared_bytes += n * size;
            }
            if let Some(rest) = line.strip_prefix(".visible .entry ") {
                let name = rest.trim_end_matches('(').to_string();
                let mut params = Vec::new();
                i += 1;
                while lines[i].trim() != ")" {
                    let p = lines[i].trim().trim_end_matches(',');
                    params.push(p.split_whitespace().nth(2).unwrap().to_string());
                    i += 1;
                }
                while lines[i].trim() != "{" {
                    i += 1;
                }
                i += 1;
                let mut regs: BTreeMap<String, usize> = BTreeMap::new();
                let mut code = Vec::new();
                let mut labels = BTreeMap::new();
                while lines[i].trim() != "}" {
                    let l = lines[i].trim();
                    i += 1;
                    if l.is_empty() || l.starts_with("//") || l.starts_with(".reg") {
                        continue;
                    }
                    if let Some(label) = l.strip_suffix(':') {
                        labels.insert(label.to_string(), code.len());
                        continue;
                    }
                    code.push(parse_instr(l, &mut regs, &shared));
                }
                let n = regs.len();
                entries.insert(
                    name,
                    Entry {
                        params,
                        code,
                        labels,
                        regs: n,
                    },
                );
            }
            i += 1;
        }
        Module {
            entries,
            shared,
            shared_bytes,
        }
    }
}

fn reg_index(name: &str, regs: &mut BTreeMap<String, usize>) -> usize {
    let n = regs.len();
    *regs.entry(name.to_string()).or_insert(n)
}

fn parse_opnd(s: &str, regs: &mut BTreeMap<String, usize>) -> Opnd {
    if let Some(inner) = s.strip_prefix('{') {
        let inner = inner.trim_end_matches('}');
        return Opnd::Vec(
            inner
                .split(',')
                .map(|r| reg_index(r.trim(), regs))
                .collect(),
        );
    }
    if let Some(inner) = s.strip_prefix('[') {
        let inner = inner.trim_end_matches(']');
        let (base, off) = match inner.split_once('+') {
            Some((b, o)) => (b, o.parse().unwrap()),
            None => (inner, 0),
        };
        return Opnd::Mem {
            base: Box::new(parse_opnd(base, regs)),
            off,
        };
    }
    if s.starts_with("%tid.") || s.starts_with("%ctaid.") || s.starts_with("%nctaid.") {
        return Opnd::Sym(s.to_string());
    }
    if let Some(p) = s.strip_prefix("!%") {
        return Opnd::NotReg(reg_index(&format!("%{p}"), regs));
    }
    if s.starts_with('%') {
        return Opnd::Reg(reg_index(s, regs));
    }
    if s.starts_with("$L") {
        return Opnd::Label(s.to_string());
    }
    match int_lit(s) {
        Some(v) => Opnd::Imm(v),
        None => Opnd::Sym(s.to_string()),
    }
}

fn parse_instr(
    l: &str,
    regs: &mut BTreeMap<String, usize>,
    _shared: &BTreeMap<String, (u32, u32)>,
) -> Instr {
    let l = l.trim_end_matches(';');
    let (guard, rest) = match l.strip_prefix('@') {
        Some(r) => {
            let (g, rest) = r.split_once(' ').unwrap();
            let (neg, name) = match g.strip_prefix('!') {
                Some(n) => (true, n),
                None => (false, g),
            };
            (Some((reg_index(name, regs), neg)), rest)
        }
        None => (None, l),
    };
    let (op, args) = match rest.split_once(' ') {
        Some((o, a)) => (o, a),
        None => (rest, ""),
    };
    // The special registers (%tid.x ...) are operands like any other.
    let args = split_top(args)
        .iter()
        .map(|a| parse_opnd(a, regs))
        .collect();
    Instr {
        guard,
        op: op.to_string(),
        args,
    }
}

/// A global buffer bound to a pointer parameter.
pub struct Buffer {
    pub bytes: Vec<u8>,
}

/// A kernel argument.
pub enum Arg {
    Buf(usize),
    Int(i32),
}

const SPACE_SHIFT: u32 = 40;

fn f(v: u64) -> f32 {
    f32::from_bits(v as u32)
}
fn fb(x: f32) -> u64 {
    u64::from(x.to_bits())
}
fn s32(v: u64) -> i32 {
    v as u32 as i32
}
fn su(x: i32) -> u64 {
    u64::from(x as u32)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Run,
    /// Waiting at the collective at this pc.
    Wait(usize),
    Done,
}

struct Thread {
    pc: usize,
    regs: Vec<u64>,
    state: State,
    tid: [u32; 3],
    /// `cp.async` copies not yet committed: (shared offset, bytes).
    uncommitted: Vec<(usize, Vec<u8>)>,
    /// Committed groups, oldest first; they land in shared memory only at
    /// a `cp.async.wait_*` that covers them (so a missing wait is caught).
    groups: Vec<Vec<(usize, Vec<u8>)>>,
}

/// Runs `entry` over `grid` blocks of `block` threads.
pub fn launch(
    m: &Module,
    entry: &str,
    grid: [u32; 3],
    block: [u32; 3],
    args: &[(&str, Arg)],
    bufs: &mut [Buffer],
) {
    launch_with_shared(m, entry, grid, block, 0, args, bufs);
}

/// [`launch`] with `dynamic` bytes of `.extern .shared` memory.
pub fn launch_with_shared(
    m: &Module,
    entry: &str,
    grid: [u32; 3],
    block: [u32; 3],
    dynamic: u32,
    args: &[(&str, Arg)],
    bufs: &mut [Buffer],
) {
    let e = m
        .entries
        .get(entry)
        .unwrap_or_else(|| panic!("no entry {entry}"));
    let mut params = BTreeMap::new();
    for p in &e.params {
        let short = p.rsplit("_param_").next().unwrap();
        let (_, a) = args
            .iter()
            .find(|(n, _)| *n == short)
            .unwrap_or_else(|| panic!("argument {short} not bound"));
        let v = match a {
            Arg::Buf(i) => ((*i as u64) + 1) << SPACE_SHIFT,
            Arg::Int(x) => su(*x),
        };
        params.insert(p.clone(), v);
    }
    for bz in 0..grid[2] {
        for by in 0..grid[1] {
            for bx in 0..grid[0] {
                run_block(m, e, &params, [[bx, by, bz], grid], block, dynamic, bufs);
            }
        }
    }
}

fn run_block(
    m: &Module,
    e: &Entry,
    params: &BTreeMap<String, u64>,
    [ctaid, grid]: [[u32; 3]; 2],
    block: [u32; 3],
    dynamic: u32,
    bufs: &mut [Buffer],
) {
    let mut shared = vec![0u8; (m.shared_bytes + dynamic) as usize];
    let mut threads = Vec::new();
    for z in 0..block[2] {
        for y in 0..block[1] {
            for x in 0..block[0] {
                threads.push(Thread {
                    pc: 0,
                    regs: vec![0; e.regs],
                    state: State::Run,
                    tid: [x, y, z],
                    uncommitted: Vec::new(),
                    groups: Vec::new(),
                });
            }
        }
    }
    let warps = threads.len().div_ceil(32);
    let mut steps = 0u64;
    loop {
        let mut progressed = false;
        for t in threads.iter_mut() {
            while t.state == State::Run {
                step(m, e, params, [ctaid, grid], t, bufs, &mut shared);
                steps += 1;
                assert!(steps < 200_000_000, "runaway kernel");
                progressed = true;
            }
        }
        if threads.iter().all(|t| t.state == State::Done) {
            return;
        }
        // Warp collectives: every thread of the warp waiting at one pc.
        for w in 0..warps {
            let lanes = w * 32..((w + 1) * 32).min(threads.len());
            let pcs: Vec<State> = threads[lanes.clone()].iter().map(|t| t.state).collect();
            let State::Wait(pc) = pcs[0] else { continue };
            if !pcs.iter().all(|s| *s == State::Wait(pc)) {
                continue;
            }
            let ins = &e.code[pc];
            if ins.op == "bar.sync" {
                continue;
            }
            collective(e, ins, &mut threads[lanes], &shared);
            progressed = true;
        }
        // Block barrier: every live thread waiting at a bar.sync.
        let at_bar = |t: &Thread| match t.state {
            State::Wait(pc) => e.code[pc].op == "bar.sync",
            _ => false,
        };
        if threads.iter().any(at_bar) && threads.iter().all(|t| at_bar(t) || t.state == State::Done)
        {
            assert!(
                threads.iter().all(|t| t.state != State::Done),
                "a thread exited while others wait at a barrier"
            );
            let pcs: Vec<State> = threads.iter().map(|t| t.state).collect();
            assert!(pcs.iter().all(|s| *s == pcs[0]), "divergent barriers");
            for t in threads.iter_mut() {
                t.pc += 1;
                t.state = State::Run;
            }
            progressed = true;
        }
        assert!(
            progressed,
            "deadlock at {:?}",
            threads.iter().map(|t| t.state).collect::<Vec<_>>()
        );
    }
}

fn reg(o: &Opnd) -> usize {
    match o {
        Opnd::Reg(r) => *r,
        other => panic!("not a register: {other:?}"),
    }
}

fn collective(e: &Entry, ins: &Instr, lanes: &mut [Thread], shared: &[u8]) {
    if ins.op.starts_with("ldmatrix.sync.aligned.m8n8.") {
        // Lane 8i + r gives row r of matrix i; lane l receives, of every
        // matrix, the word at row l / 4, column pair l % 4.
        let Opnd::Vec(dst) = &ins.args[0] else {
            panic!("ldmatrix destination")
        };
        let Opnd::Mem { base, off } = &ins.args[1] else {
            panic!("ldmatrix address")
        };
        let Opnd::Reg(base) = base.as_ref() else {
            panic!("ldmatrix base")
        };
        let rows: Vec<usize> = lanes
            .iter()
            .map(|t| (t.regs[*base] as i64 + off) as usize)
            .collect();
        for &r in &rows[..8 * dst.len()] {
            assert!(r + 16 <= shared.len(), "ldmatrix past shared memory");
            assert_eq!(r % 16, 0, "ldmatrix row misaligned");
        }
        // `.trans`: lane l receives, of every matrix, column l / 4 at rows
        // 2(l % 4) and 2(l % 4) + 1 (low half first).
        let trans = ins.op.contains(".trans.");
        let half_at = |i: usize, row: usize, col: usize| {
            let a = rows[8 * i + row] + 2 * col;
            u64::from(u16::from_le_bytes([shared[a], shared[a + 1]]))
        };
        let words: Vec<Vec<u64>> = (0..lanes.len())
            .map(|l| {
                (0..dst.len())
                    .map(|i| {
                        if trans {
                            half_at(i, 2 * (l % 4), l / 4)
                                | half_at(i, 2 * (l % 4) + 1, l / 4) << 16
                        } else {
                            half_at(i, l / 4, 2 * (l % 4))
                                | half_at(i, l / 4, 2 * (l % 4) + 1) << 16
                        }
                    })
                    .collect()
            })
            .collect();
        for (t, w) in lanes.iter_mut().zip(words) {
            for (r, v) in dst.iter().zip(w) {
                t.regs[*r] = v;
            }
            t.pc += 1;
            t.state = State::Run;
        }
        return;
    }
    if ins.op == "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" {
        let vecs: Vec<&Vec<usize>> = ins
            .args
            .iter()
            .map(|o| match o {
                Opnd::Vec(v) => v,
                other => panic!("mma operand {other:?}"),
            })
            .collect();
        let half = |w: u64, hi: bool| {
            f64::from(f16::from_bits((w >> if hi { 16 } else { 0 }) as u16).to_f32())
        };
        let mut a = [[0f64; 16]; 16];
        let mut bm = [[0f64; 8]; 16];
        let mut c = [[0f64; 8]; 16];
        for (l, t) in lanes.iter().enumerate() {
            let (g, q) = (l / 4, l % 4);
            let ar = |i: usize| t.regs[vecs[1][i]];
            for (i, (row, col)) in [
                (g, 2 * q),
                (g + 8, 2 * q),
                (g, 2 * q + 8),
                (g + 8, 2 * q + 8),
            ]
            .into_iter()
            .enumerate()
            {
                a[row][col] = half(ar(i), false);
                a[row][col + 1] = half(ar(i), true);
            }
            for (i, k) in [2 * q, 2 * q + 8].into_iter().enumerate() {
                let w = t.regs[vecs[2][i]];
                bm[k][g] = half(w, false);
                bm[k + 1][g] = half(w, true);
            }
            for (i, (row, col)) in [
                (g, 2 * q),
                (g, 2 * q + 1),
                (g + 8, 2 * q),
                (g + 8, 2 * q + 1),
            ]
            .into_iter()
            .enumerate()
            {
                c[row][col] = f64::from(f(t.regs[vecs[3][i]]));
            }
        }
        for (l, t) in lanes.iter_mut().enumerate() {
            let (g, q) = (l / 4, l % 4);
            for (i, (row, col)) in [
                (g, 2 * q),
                (g, 2 * q + 1),
                (g + 8, 2 * q),
                (g + 8, 2 * q + 1),
            ]
            .into_iter()
            .enumerate()
            {
                let v = (0..16).map(|k| a[row][k] * bm[k][col]).sum::<f64>() + c[row][col];
                t.regs[vecs[0][i]] = fb(v as f32);
            }
            t.pc += 1;
            t.state = State::Run;
        }
        return;
    }
    if ins.op == "bra.uni" {
        let (p, neg) = ins.guard.expect("a guarded bra.uni");
        let taken: Vec<bool> = lanes.iter().map(|t| (t.regs[p] != 0) != neg).collect();
        assert!(
            taken.iter().all(|&x| x == taken[0]),
            "bra.uni diverges: {taken:?}"
        );
        let Opnd::Label(l) = &ins.args[0] else {
            panic!("branch target")
        };
        for t in lanes.iter_mut() {
            t.pc = if taken[0] { e.labels[l] } else { t.pc + 1 };
            t.state = State::Run;
        }
        return;
    }
    let vals: Vec<u64> = lanes.iter().map(|t| t.regs[reg(&ins.args[1])]).collect();
    match ins.op.as_str() {
        "shfl.sync.bfly.b32" => {
            let Opnd::Imm(off) = ins.args[2] else {
                panic!("shfl offset")
            };
            for (i, t) in lanes.iter_mut().enumerate() {
                let src = i ^ off as usize;
                t.regs[reg(&ins.args[0])] = vals[src];
            }
        }
        "vote.sync.any.pred" => {
            let any = vals.iter().any(|&v| v != 0);
            for t in lanes.iter_mut() {
                t.regs[reg(&ins.args[0])] = u64::from(any);
            }
        }
        other => panic!("collective {other}"),
    }
    for t in lanes.iter_mut() {
        t.pc += 1;
        t.state = State::Run;
    }
}

fn global(bufs: &mut [Buffer], addr: u64, len: usize) -> &mut [u8] {
    let space = (addr >> SPACE_SHIFT) as usize;
    assert!(
        space >= 1 && space <= bufs.len(),
        "address {addr:#x} outside every buffer"
    );
    let off = (addr & ((1 << SPACE_SHIFT) - 1)) as usize;
    let b = &mut bufs[space - 1].bytes;
    assert!(
        off + len <= b.len(),
        "out of bounds: {len} bytes at {off} of a {}-byte buffer",
        b.len()
    );
    if len.is_power_of_two() {
        assert_eq!(
            off % len.min(16),
            0,
            "misaligned {len}-byte access at {off}"
        );
    }
    &mut b[off..off + len]
}

fn step(
    m: &Module,
    e: &Entry,
    params: &BTreeMap<String, u64>,
    [ctaid, grid]: [[u32; 3]; 2],
    t: &mut Thread,
    bufs: &mut [Buffer],
    shared: &mut [u8],
) {
    let ins = &e.code[t.pc];
    // A guarded `bra.uni` claims the warp agrees: wait for the warp and
    // check it (see `collective`).
    if ins.op == "bra.uni" && ins.guard.is_some() && t.state == State::Run {
        t.state = State::Wait(t.pc);
        return;
    }
    if let Some((p, neg)) = ins.guard
        && ((t.regs[p] != 0) == neg)
    {
        t.pc += 1;
        return;
    }
    let val = |t: &Thread, o: &Opnd| -> u64 {
        match o {
            Opnd::Reg(r) => t.regs[*r],
            Opnd::NotReg(r) => u64::from(t.regs[*r] == 0),
            Opnd::Imm(v) => *v,
            Opnd::Sym(s) => match s.as_str() {
                "%tid.x" => u64::from(t.tid[0]),
                "%tid.y" => u64::from(t.tid[1]),
                "%tid.z" => u64::from(t.tid[2]),
                "%ctaid.x" => u64::from(ctaid[0]),
                "%ctaid.y" => u64::from(ctaid[1]),
                "%ctaid.z" => u64::from(ctaid[2]),
                "%nctaid.x" => u64::from(grid[0]),
                "%nctaid.y" => u64::from(grid[1]),
                "%nctaid.z" => u64::from(grid[2]),
                name => u64::from(
                    m.shared
                        .get(name)
                        .unwrap_or_else(|| panic!("unknown symbol {name}"))
                        .0,
                ),
            },
            other => panic!("not a value: {other:?}"),
        }
    };
    let addr = |t: &Thread, o: &Opnd| -> u64 {
        match o {
            Opnd::Mem { base, off } => match base.as_ref() {
                Opnd::Sym(s) if params.contains_key(s) => params[s],
                b => val(t, b).wrapping_add(*off as u64),
            },
            other => panic!("not an address: {other:?}"),
        }
    };
    let a = &ins.args;
    let op = ins.op.as_str();
    let mut next = t.pc + 1;
    let set = |t: &mut Thread, o: &Opnd, v: u64| t.regs[reg(o)] = v;
    let x = |t: &Thread, i: usize| val(t, &a[i]);
    match op {
        _ if op == "bar.sync"
            || op == "shfl.sync.bfly.b32"
            || op == "vote.sync.any.pred"
            || op.starts_with("ldmatrix.")
            || op.starts_with("mma.") =>
        {
            t.state = State::Wait(t.pc);
            return;
        }
        "ret" => {
            t.state = State::Done;
            return;
        }
        "bra" | "bra.uni" => {
            let Opnd::Label(l) = &a[0] else {
                panic!("branch target")
            };
            next = e.labels[l];
        }
        "ld.param.u64" | "ld.param.u32" => {
            let v = addr(t, &a[1]);
            set(t, &a[0], v);
        }
        "cvta.to.global.u64" | "mov.u32" | "mov.f32" | "mov.b16" | "mov.b32" => {
            match (&a[0], &a[1]) {
                (Opnd::Vec(parts), src) => {
                    let v = val(t, src);
                    let bits = if parts.len() == 2 {
                        16
                    } else {
                        panic!("unpack")
                    };
                    for (k, r) in parts.iter().enumerate() {
                        t.regs[*r] = (v >> (bits * k)) & 0xFFFF;
                    }
                }
                (dst, Opnd::Vec(parts)) => {
                    let v = parts.iter().enumerate().fold(0u64, |acc, (k, r)| {
                        acc | ((t.regs[*r] & 0xFFFF) << (16 * k))
                    });
                    set(t, dst, v);
                }
                (dst, src) => {
                    let v = val(t, src);
                    let v = if op == "mov.b16" { v & 0xFFFF } else { v };
                    set(t, dst, v);
                }
            }
        }
        "mul.wide.s32" => {
            let v = i64::from(s32(x(t, 1))) * i64::from(s32(x(t, 2)));
            set(t, &a[0], v as u64);
        }
        "mul.wide.u32" => {
            let v = (x(t, 1) as u32 as u64) * (x(t, 2) as u32 as u64);
            set(t, &a[0], v);
        }
        "add.s64" => {
            let v = x(t, 1).wrapping_add(x(t, 2));
            set(t, &a[0], v);
        }
        "mad.lo.s32" => {
            let v = s32(x(t, 1))
                .wrapping_mul(s32(x(t, 2)))
                .wrapping_add(s32(x(t, 3)));
            set(t, &a[0], su(v));
        }
        "add.s32" => set(t, &a[0], su(s32(x(t, 1)).wrapping_add(s32(x(t, 2))))),
        "sub.s32" => set(t, &a[0], su(s32(x(t, 1)).wrapping_sub(s32(x(t, 2))))),
        "mul.lo.s32" => set(t, &a[0], su(s32(x(t, 1)).wrapping_mul(s32(x(t, 2))))),
        "min.s32" => set(t, &a[0], su(s32(x(t, 1)).min(s32(x(t, 2))))),
        "div.s32" => {
            let d = s32(x(t, 2));
            assert_ne!(d, 0, "division by zero");
            set(t, &a[0], su(s32(x(t, 1)) / d));
        }
        "rem.u32" => {
            let d = x(t, 2) as u32;
            assert_ne!(d, 0, "division by zero");
            set(t, &a[0], u64::from(x(t, 1) as u32 % d));
        }
        "bfe.u32" => {
            let (v, pos, len) = (x(t, 1) as u32, x(t, 2) as u32, x(t, 3) as u32);
            assert!(len > 0 && pos + len <= 32, "bfe field");
            set(t, &a[0], u64::from((v >> pos) & (u32::MAX >> (32 - len))));
        }
        "fma.rn.f16x2" | "sub.f16x2" | "mul.rn.f16x2" => {
            let lane = |w: u64, k: u32| f64::from(f16::from_bits((w >> (16 * k)) as u16).to_f32());
            let mut v = 0u64;
            for k in 0..2 {
                let r = match op {
                    "fma.rn.f16x2" => lane(x(t, 1), k) * lane(x(t, 2), k) + lane(x(t, 3), k),
                    "sub.f16x2" => lane(x(t, 1), k) - lane(x(t, 2), k),
                    _ => lane(x(t, 1), k) * lane(x(t, 2), k),
                };
                v |= u64::from(f16::from_f64(r).to_bits()) << (16 * k);
            }
            set(t, &a[0], v);
        }
        "cp.async.cg.shared.global" | "cp.async.ca.shared.global" => {
            let dst = addr(t, &a[0]) as usize;
            let src = addr(t, &a[1]);
            let (size, n) = (x(t, 2) as usize, x(t, 3) as usize);
            // .cg copies 16 bytes; .ca 4, 8 or 16.
            let sizes: &[usize] = if op == "cp.async.cg.shared.global" {
                &[16]
            } else {
                &[4, 8, 16]
            };
            assert!(
                sizes.contains(&size) && n <= size,
                "cp.async of {n} of {size} bytes"
            );
            assert_eq!(dst % size, 0, "cp.async destination misaligned");
            let mut bytes = vec![0u8; size];
            if n > 0 {
                assert_eq!(src % size as u64, 0, "cp.async source misaligned");
                bytes[..n].copy_from_slice(global(bufs, src, n.max(1)).get(..n).unwrap());
            }
            t.uncommitted.push((dst, bytes));
        }
        "cp.async.commit_group" => {
            let g = std::mem::take(&mut t.uncommitted);
            t.groups.push(g);
        }
        "cp.async.wait_group" | "cp.async.wait_all" => {
            let keep = if op == "cp.async.wait_all" {
                let g = std::mem::take(&mut t.uncommitted);
                t.groups.push(g);
                0
            } else {
                x(t, 0) as usize
            };
            while t.groups.len() > keep {
                for (dst, bytes) in t.groups.remove(0) {
                    let end = dst + bytes.len();
                    assert!(end <= shared.len(), "cp.async past shared memory");
                    shared[dst..end].copy_from_slice(&bytes);
                }
            }
        }
        "div.u32" => {
            let d = x(t, 2) as u32;
            assert_ne!(d, 0, "division by zero");
            set(t, &a[0], u64::from(x(t, 1) as u32 / d));
        }
        "lop3.b32" => {
            // Bit i of the result is bit (a_i·4 + b_i·2 + c_i) of the LUT.
            let (p, q, r, lut) = (x(t, 1) as u32, x(t, 2) as u32, x(t, 3) as u32, x(t, 4));
            let mut v = 0u32;
            for i in 0..32 {
                let idx = (((p >> i) & 1) << 2) | (((q >> i) & 1) << 1) | ((r >> i) & 1);
                v |= (((lut >> idx) & 1) as u32) << i;
            }
            set(t, &a[0], u64::from(v));
        }
        "bfe.s32" => {
            let (v, pos, len) = (x(t, 1) as u32, x(t, 2) as u32, x(t, 3) as u32);
            assert!(len > 0 && pos + len <= 32, "bfe field");
            let field = ((v << (32 - pos - len)) as i32) >> (32 - len);
            set(t, &a[0], su(field));
        }
        "and.b32" => set(t, &a[0], (x(t, 1) & x(t, 2)) & 0xFFFF_FFFF),
        "sub.u32" => set(
            t,
            &a[0],
            u64::from((x(t, 1) as u32).wrapping_sub(x(t, 2) as u32)),
        ),
        "clz.b32" => set(t, &a[0], u64::from((x(t, 1) as u32).leading_zeros())),
        "and.pred" => set(t, &a[0], u64::from(x(t, 1) != 0 && x(t, 2) != 0)),
        "not.pred" => set(t, &a[0], u64::from(x(t, 1) == 0)),
        "mov.pred" => set(t, &a[0], u64::from(x(t, 1) != 0)),
        "or.b32" => set(t, &a[0], (x(t, 1) | x(t, 2)) & 0xFFFF_FFFF),
        "xor.b32" => set(t, &a[0], (x(t, 1) ^ x(t, 2)) & 0xFFFF_FFFF),
        "shl.b16" => set(t, &a[0], (x(t, 1) << x(t, 2)) & 0xFFFF),
        "shl.b32" => set(t, &a[0], u64::from((x(t, 1) as u32) << x(t, 2))),
        "shr.u32" => set(t, &a[0], u64::from((x(t, 1) as u32) >> x(t, 2))),
        "shr.s32" => set(t, &a[0], su(s32(x(t, 1)) >> x(t, 2))),
        "prmt.b32" => {
            let bytes = (x(t, 2) << 32) | (x(t, 1) & 0xFFFF_FFFF);
            let c = x(t, 3);
            let mut v = 0u64;
            for k in 0..4 {
                let sel = (c >> (4 * k)) & 0xF;
                let mut byte = (bytes >> (8 * (sel & 7))) & 0xFF;
                if sel & 8 != 0 {
                    byte = if byte & 0x80 != 0 { 0xFF } else { 0 };
                }
                v |= byte << (8 * k);
            }
            set(t, &a[0], v);
        }
        "selp.b32" | "selp.u32" | "selp.f32" => {
            let v = if x(t, 3) != 0 { x(t, 1) } else { x(t, 2) };
            set(t, &a[0], v);
        }
        // `.rn` only forbids contraction into an fma, which the simulator
        // never does.
        "add.f32" | "add.rn.f32" => set(t, &a[0], fb(f(x(t, 1)) + f(x(t, 2)))),
        "sub.f32" => set(t, &a[0], fb(f(x(t, 1)) - f(x(t, 2)))),
        "mul.f32" | "mul.rn.f32" => set(t, &a[0], fb(f(x(t, 1)) * f(x(t, 2)))),
        "div.rn.f32" => set(t, &a[0], fb(f(x(t, 1)) / f(x(t, 2)))),
        "max.f32" => set(t, &a[0], fb(f(x(t, 1)).max(f(x(t, 2))))),
        "fma.rn.f32" => set(t, &a[0], fb(f(x(t, 1)).mul_add(f(x(t, 2)), f(x(t, 3))))),
        "sqrt.rn.f32" => set(t, &a[0], fb(f(x(t, 1)).sqrt())),
        "rcp.rn.f32" => set(t, &a[0], fb(1.0 / f(x(t, 1)))),
        // The silu epilogue's `ex2.approx.f32` keeps subnormals; the sum
        // 1 + 2^x it feeds does not see the difference.
        "ex2.approx.ftz.f32" | "ex2.approx.f32" => set(t, &a[0], fb(f(x(t, 1)).exp2())),
        "cvt.f32.f16" => set(t, &a[0], fb(f16::from_bits(x(t, 1) as u16).to_f32())),
        "cvt.rn.f16.f32" => set(t, &a[0], u64::from(f16::from_f32(f(x(t, 1))).to_bits())),
        // d = {a, b}: a in the upper half.
        "cvt.rn.f16x2.f32" => {
            let h = |v: u64| u64::from(f16::from_f32(f(v)).to_bits());
            set(t, &a[0], h(x(t, 1)) << 16 | h(x(t, 2)));
        }
        "cvt.u64.u32" => set(t, &a[0], x(t, 1) & 0xFFFF_FFFF),
        "neg.f32" => set(t, &a[0], fb(-f(x(t, 1)))),
        "cvt.rn.f32.s32" => set(t, &a[0], fb(s32(x(t, 1)) as f32)),
        "cvt.rn.f16x2.e4m3x2" => {
            let v = x(t, 1);
            let half = |b: u64| u64::from(f16::from_f32(fp8_e4m3_to_f32(b as u8)).to_bits());
            set(t, &a[0], half(v & 0xFF) | (half((v >> 8) & 0xFF) << 16));
        }
        _ if op.starts_with("setp.") => {
            let parts: Vec<&str> = op.split('.').collect();
            // setp.CMP[.BOOL].TYPE
            let (cmp, combine, ty) = match parts.len() {
                3 => (parts[1], None, parts[2]),
                _ => (parts[1], Some(parts[2]), parts[3]),
            };
            let (l, r) = (x(t, 1), x(t, 2));
            let res = match ty {
                "s32" => {
                    let (l, r) = (s32(l), s32(r));
                    match cmp {
                        "ge" => l >= r,
                        "gt" => l > r,
                        "le" => l <= r,
                        "lt" => l < r,
                        "eq" => l == r,
                        "ne" => l != r,
                        c => panic!("{c}"),
                    }
                }
                "u32" => {
                    let (l, r) = (l as u32, r as u32);
                    match cmp {
                        "eq" => l == r,
                        "ne" => l != r,
                        "ge" => l >= r,
                        "lt" => l < r,
                        c => panic!("{c}"),
                    }
                }
                "f32" => {
                    let (l, r) = (f(l), f(r));
                    match cmp {
                        "ge" => l >= r,
                        "le" => l <= r,
                        "lt" => l < r,
                        "gt" => l > r,
                        "eq" => l == r,
                        c => panic!("{c}"),
                    }
                }
                other => panic!("setp type {other}"),
            };
            let res = match combine {
                Some("and") => res && x(t, 3) != 0,
                Some("or") => res || x(t, 3) != 0,
                None => res,
                Some(other) => panic!("setp combine {other}"),
            };
            set(t, &a[0], u64::from(res));
        }
        _ if op.starts_with("ld.global.") => {
            let ad = addr(t, &a[1]);
            let ty = op.rsplit('.').next().unwrap();
            let vec = if op.contains(".v4.") {
                4
            } else if op.contains(".v2.") {
                2
            } else {
                1
            };
            let size = match ty {
                "u8" | "s8" => 1,
                "u16" | "b16" => 2,
                _ => 4,
            };
            let bytes = global(bufs, ad, size * vec).to_vec();
            let regs: Vec<usize> = match &a[0] {
                Opnd::Vec(r) => r.clone(),
                o => vec![reg(o)],
            };
            for (k, r) in regs.iter().enumerate() {
                let chunk = &bytes[k * size..(k + 1) * size];
                t.regs[*r] = match ty {
                    "u8" => u64::from(chunk[0]),
                    "s8" => su(i32::from(chunk[0] as i8)),
                    "u16" | "b16" => u64::from(u16::from_le_bytes([chunk[0], chunk[1]])),
                    _ => u64::from(u32::from_le_bytes(chunk.try_into().unwrap())),
                };
            }
        }
        _ if op.starts_with("st.global.") => {
            let ad = addr(t, &a[0]);
            let v = x(t, 1);
            let size = if op.ends_with("b16") { 2 } else { 4 };
            global(bufs, ad, size).copy_from_slice(&v.to_le_bytes()[..size]);
        }
        _ if op.starts_with("ld.shared.") || op.starts_with("st.shared.") => {
            let load = op.starts_with("ld");
            let (mem, data) = if load { (&a[1], &a[0]) } else { (&a[0], &a[1]) };
            let ad = addr(t, mem) as usize;
            let regs: Vec<usize> = match data {
                Opnd::Vec(r) => r.clone(),
                o => vec![reg(o)],
            };
            let len = 4 * regs.len();
            assert!(
                ad + len <= shared.len() && ad.is_multiple_of(len),
                "shared access of {len} bytes at {ad}"
            );
            for (k, r) in regs.iter().enumerate() {
                let at = ad + 4 * k;
                if load {
                    let v = u32::from_le_bytes(shared[at..at + 4].try_into().unwrap());
                    t.regs[*r] = u64::from(v);
                } else {
                    let v = t.regs[*r] as u32;
                    shared[at..at + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        other => panic!("the simulator does not know `{other}`"),
    }
    if std::env::var("SIM_TRACE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        == Some(t.tid[0])
        && ctaid == [0, 0, 0]
    {
        let dst = match a.first() {
            Some(Opnd::Reg(r)) => {
                format!("{:#x} ({})", t.regs[*r], f32::from_bits(t.regs[*r] as u32))
            }
            _ => String::new(),
        };
        eprintln!("{op} {:?} -> {dst}", a);
    }
    t.pc = next;
}

/// A PTX matmul's operands as its kernels take them: x as f16 bits,
/// GPU-packed weight codes, f32 group scales and offsets (empty where the
/// format has none) and the f32 bias (empty: none).
pub struct MatmulOperands {
    pub x_f16: Vec<u8>,
    pub codes: Vec<u8>,
    /// Group parameters as the format stores them (`quant::param_bytes`).
    pub scales: Vec<u8>,
    pub offsets: Vec<u8>,
    pub bias: Vec<f32>,
}

/// Bind `ops` to `prog`'s entry by name, launch it over the grid its plan
/// gives for `[e, h, l]`, and return y as f32 (widened where the kernel
/// writes f16).
pub fn run_matmul(
    prog: &tessera_codegen::ptx::PtxProgram,
    ops: MatmulOperands,
    [e, h, l]: [usize; 3],
) -> Vec<f32> {
    use tessera_codegen::gpu::LaunchExtent;
    let plan = &prog.plan;
    let module = Module::parse(&prog.text);
    let y_half = plan.y_format == tessera_dsl::Format::F16;
    let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut bufs: Vec<Buffer> = [
        ops.x_f16,
        ops.codes,
        ops.scales,
        ops.offsets,
        f32_bytes(&ops.bias),
        vec![0u8; e * h * if y_half { 2 } else { 4 }],
    ]
    .into_iter()
    .map(|bytes| Buffer { bytes })
    .collect();
    let int = |v: usize| Arg::Int(i32::try_from(v).expect("a test-sized extent"));
    let args = [
        ("x", Arg::Buf(0)),
        ("w", Arg::Buf(1)),
        ("scales", Arg::Buf(2)),
        ("offsets", Arg::Buf(3)),
        ("bias", Arg::Buf(4)),
        ("y", Arg::Buf(5)),
        ("e", int(e)),
        ("h", int(h)),
        ("l", int(l)),
    ];
    let extent = |x: LaunchExtent| match x {
        LaunchExtent::E => e,
        LaunchExtent::H => h,
        _ => 1,
    };
    let grid = plan
        .launch
        .map(|d| (d.global(extent(d.extent)) / d.local as usize) as u32);
    let block = plan.launch.map(|d| d.local);
    launch_with_shared(
        &module,
        &plan.entry,
        grid,
        block,
        prog.dynamic_shared_bytes,
        &args,
        &mut bufs,
    );
    if y_half {
        bufs[5]
            .bytes
            .chunks(2)
            .map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect()
    } else {
        bufs[5]
            .bytes
            .chunks(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }
}
