//! Cross-checks an emitted listing against its bytes with `llvm-mc`.
//!
//! The listing is the emitter's own log; the bytes come from dynasm. Both are
//! reduced to a disassembly by llvm-mc (the listing assembled first) and the
//! two instruction sequences must be equal. Encodings may legitimately
//! differ (dynasm keeps a SIB byte for run-time base registers, picks
//! rel32 branches and the imm8 form of shifts by one), so comparison is on normalized instruction text.

use std::io::Write;
use std::process::{Command, Stdio};

/// Why the cross-check could not run or failed.
#[derive(Debug)]
pub enum McError {
    /// llvm-mc is not installed: tests report and skip (fail under CI:
    /// `missing`).
    Missing,
    Failed(String),
}

/// Whether this test binary runs under an emulator (`scripts/test-aarch64.sh`
/// sets `TESSERA_EMULATED`): there a test skips the llvm-mc cross-check,
/// because qemu-user can deadlock forking a multithreaded guest to start
/// llvm-mc (seen: a child stuck before exec, the suite hung), and the host
/// run of the same test checks the same bytes natively.
pub fn emulated() -> bool {
    std::env::var_os("TESSERA_EMULATED").is_some()
}

/// `tool` could not be started: SKIP on a developer's machine, a failure
/// naming it under CI (`tessera_dsl::testing`).
fn missing(tool: &str) -> McError {
    tessera_dsl::testing::missing_tool("llvm-mc cross-check", &format!("{tool} not installed"));
    McError::Missing
}

fn run(args: &[&str], input: &str) -> Result<String, McError> {
    let mut child = Command::new("llvm-mc")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|_| missing("llvm-mc"))?;
    child
        .stdin
        .take()
        .ok_or_else(|| McError::Failed("no stdin".into()))?
        .write_all(input.as_bytes())
        .map_err(|e| McError::Failed(e.to_string()))?;
    let out = child
        .wait_with_output()
        .map_err(|e| McError::Failed(e.to_string()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || stderr.contains("error") {
        return Err(McError::Failed(format!("llvm-mc {args:?}: {stderr}")));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Bytes as llvm-mc's `--disassemble` input.
fn byte_text(bytes: &[u8]) -> String {
    let parts: Vec<String> = bytes.iter().map(|b| format!("0x{b:02x}")).collect();
    parts.join(" ")
}

/// Normalized instruction lines of an llvm-mc disassembly.
fn normalize(disasm: &str) -> Vec<String> {
    disasm
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty() && !l.starts_with('.'))
        .map(|l| {
            let l = l.replace("riz + ", "").replace(" + riz", "");
            let words: Vec<&str> = l.split_whitespace().collect();
            match words.first() {
                // branch targets are offsets that depend on encoding length
                Some(m) if m.starts_with('j') => m.to_string(),
                // shifts by one have a short form (D1) that prints without
                // the count; dynasm encodes the imm8 form (C1)
                Some(&("shl" | "shr" | "sar")) if words.len() == 2 => {
                    format!("{}, 1", words.join(" "))
                }
                _ => words.join(" "),
            }
        })
        .collect()
}

/// Parse llvm-mc `-show-encoding` output into bytes.
fn encoded_bytes(text: &str) -> Vec<u8> {
    let mut bytes = Vec::new();
    for line in text.lines() {
        let Some(start) = line.find("encoding: [") else {
            continue;
        };
        let rest = &line[start + 11..];
        let end = rest.find(']').unwrap_or(rest.len());
        for item in rest[..end].split(',') {
            let item = item.trim().trim_start_matches("0x");
            // relocation placeholders like 'A' mean a branch displacement
            let v = u8::from_str_radix(item, 16).unwrap_or(0);
            bytes.push(v);
        }
    }
    bytes
}

/// x86-64: the listing (Intel syntax) and the bytes disassemble to the same
/// instructions. `mattr` e.g. "+avx2,+fma,+f16c,+avxvnni".
pub fn check_x86(listing: &str, bytes: &[u8], mattr: &str) -> Result<(), McError> {
    let triple = "-triple=x86_64";
    let mattr = format!("-mattr={mattr}");
    let ours = run(
        &[triple, &mattr, "--disassemble", "-output-asm-variant=1"],
        &byte_text(bytes),
    )?;
    let src = format!(".intel_syntax noprefix\n{listing}");
    let assembled = run(
        &[triple, &mattr, "-x86-asm-syntax=intel", "-show-encoding"],
        &src,
    )?;
    let theirs = run(
        &[triple, &mattr, "--disassemble", "-output-asm-variant=1"],
        &byte_text(&encoded_bytes(&assembled)),
    )?;
    let (a, b) = (normalize(&ours), normalize(&theirs));
    if a.len() != b.len() {
        return Err(McError::Failed(format!(
            "bytes hold {} instructions, listing {}",
            a.len(),
            b.len()
        )));
    }
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        if x != y {
            return Err(McError::Failed(format!(
                "instruction {i}: bytes say `{x}`, listing says `{y}`"
            )));
        }
    }
    Ok(())
}

/// aarch64: assemble the listing with llvm-mc into an object, take its
/// `.text`, and require it to be byte-for-byte the emitter's bytes (fixed
/// 4-byte encodings make equality, not mere equivalence, the right test).
/// `mattr` e.g. "+neon,+dotprod,+i8mm,+fullfp16". On a mismatch the error
/// names the first differing instruction with both words and its line.
pub fn check_aarch64(listing: &str, bytes: &[u8], mattr: &str) -> Result<(), McError> {
    let dir = std::env::temp_dir().join(format!(
        "tessera-mc-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| McError::Failed(e.to_string()))?;
    let obj = dir.join("k.o");
    let bin = dir.join("k.bin");
    let src = dir.join("k.s");
    std::fs::write(&src, listing).map_err(|e| McError::Failed(e.to_string()))?;
    let status = Command::new("llvm-mc")
        .args([
            "-triple=aarch64",
            &format!("-mattr={mattr}"),
            "-filetype=obj",
            "-o",
        ])
        .arg(&obj)
        .arg(&src)
        .output()
        .map_err(|_| missing("llvm-mc"))?;
    if !status.status.success() {
        return Err(McError::Failed(format!(
            "llvm-mc: {}",
            String::from_utf8_lossy(&status.stderr)
        )));
    }
    let copy = Command::new("llvm-objcopy")
        .args(["-O", "binary", "--only-section=.text"])
        .arg(&obj)
        .arg(&bin)
        .output()
        .map_err(|_| missing("llvm-objcopy"))?;
    if !copy.status.success() {
        return Err(McError::Failed(format!(
            "llvm-objcopy: {}",
            String::from_utf8_lossy(&copy.stderr)
        )));
    }
    let theirs = std::fs::read(&bin).map_err(|e| McError::Failed(e.to_string()))?;
    let _ = std::fs::remove_dir_all(&dir);
    if theirs == bytes {
        return Ok(());
    }
    let lines: Vec<&str> = listing
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//") && !l.ends_with(':'))
        .collect();
    let word = |b: &[u8], i: usize| {
        b.get(4 * i..4 * i + 4)
            .map(|w| format!("{:08x}", u32::from_le_bytes([w[0], w[1], w[2], w[3]])))
            .unwrap_or_else(|| "--------".into())
    };
    let n = bytes.len().max(theirs.len()) / 4;
    for i in 0..n {
        let (a, b) = (word(bytes, i), word(&theirs, i));
        if a != b {
            return Err(McError::Failed(format!(
                "instruction {i} `{}`: emitter {a}, llvm-mc {b} (lengths {} vs {})",
                lines.get(i).unwrap_or(&"?"),
                bytes.len(),
                theirs.len()
            )));
        }
    }
    Err(McError::Failed("lengths differ".into()))
}

/// The operands the EVEX encoder tests sweep: registers 0, 7, 8, 15, 16,
/// 31 (every encoding bit), bases that need a SIB byte or a displacement
/// (rsp, rbp, r12, r13) besides rax and r15, and displacements of zero,
/// disp8 scaled by 4, 16 and 64, both ends of the i8 range, disp32 and
/// negative ones.
pub mod evex_sweep {
    use tessera_codegen::x86::asm::{Gp, R12, R13, R15, RAX, RBP, RSP};

    pub const ZMMS: [u8; 6] = [0, 7, 8, 15, 16, 31];
    pub const BASES: [Gp; 6] = [RAX, RSP, RBP, R12, R13, R15];
    pub const DISPS: [i32; 13] = [
        0,
        4,
        16,
        64,
        -64,
        200,
        508,
        512,
        2032,
        8128,
        8192,
        -8256,
        1 << 20,
    ];
}

/// Our listing line and bytes for the instruction(s) `emit` writes, as a
/// case for [`assert_x86_encodings`].
pub fn x86_case(emit: &dyn Fn(&mut tessera_codegen::x86::asm::X86Asm)) -> (String, Vec<u8>) {
    let mut a = tessera_codegen::x86::asm::X86Asm::new();
    emit(&mut a);
    let (bytes, listing) = a.finish().expect("assemble");
    (listing.trim().to_string(), bytes)
}

/// Each `(line, bytes)` case's bytes equal llvm-mc's encoding of its
/// Intel-syntax line (with the features `mattr`): byte-for-byte checks of
/// an encoder. Prints a SKIP line and checks nothing without llvm-mc.
pub fn assert_x86_encodings(cases: &[(String, Vec<u8>)], mattr: &str) {
    let lines: Vec<String> = cases.iter().map(|(l, _)| l.clone()).collect();
    let Some(theirs) = x86_encodings(&lines, mattr) else {
        eprintln!("SKIP: llvm-mc not installed");
        return;
    };
    assert_eq!(theirs.len(), cases.len());
    for ((line, ours), theirs) in cases.iter().zip(&theirs) {
        assert_eq!(ours, theirs, "`{line}`");
    }
}

static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// llvm-mc's x86-64 encoding of each line of an Intel-syntax listing, in
/// order, with the features `mattr` (for byte-for-byte checks of encoders
/// such as the EVEX one, whose bytes must be llvm-mc's exactly); None when
/// llvm-mc is not installed. Panics with llvm-mc's message if it rejects a
/// line (a test helper: the listing is ours).
pub fn x86_encodings(lines: &[String], mattr: &str) -> Option<Vec<Vec<u8>>> {
    let src = format!(".intel_syntax noprefix\n{}\n", lines.join("\n"));
    let text = match run(
        &[
            "-triple=x86_64",
            &format!("-mattr={mattr}"),
            "-x86-asm-syntax=intel",
            "-show-encoding",
        ],
        &src,
    ) {
        Ok(text) => text,
        Err(McError::Missing) => return None,
        Err(McError::Failed(why)) => panic!("llvm-mc: {why}"),
    };
    let encodings = text
        .lines()
        .filter_map(|l| {
            let start = l.find("encoding: [")? + 11;
            let end = start + l[start..].find(']')?;
            Some(
                l[start..end]
                    .split(',')
                    .map(|b| u8::from_str_radix(b.trim().trim_start_matches("0x"), 16).unwrap())
                    .collect(),
            )
        })
        .collect();
    Some(encodings)
}
