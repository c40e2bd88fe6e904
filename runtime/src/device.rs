//! The device fingerprint: everything about this machine that changes which
//! kernel wins, so a tuning record is only used where it was measured.
//!
//! Read from `/proc/cpuinfo` and `/sys/devices/system/cpu` where present
//! (Linux, Android); anything unreadable is left empty rather than guessed.
//! GPU fields are filled by the backends that can query them (OpenCL
//! platform/device/driver, CUDA device/driver).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One cache level as the OS reports it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CacheInfo {
    pub level: u32,
    /// `Data`, `Instruction` or `Unified`.
    pub kind: String,
    pub size_kib: u64,
}

/// A group of identical cores (big.LITTLE clusters on Arm; one cluster on
/// most x86 machines).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Cluster {
    /// Arm `CPU part` (e.g. `0xd44`), or the x86 model name.
    pub part: String,
    /// Logical CPU numbers in this cluster.
    pub cpus: Vec<u32>,
    /// Maximum frequency in MHz, when the OS exposes it.
    pub max_mhz: Option<u32>,
}

/// A GPU the fingerprint covers (OpenCL or CUDA).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GpuInfo {
    /// `opencl` or `cuda`.
    pub api: String,
    pub platform: String,
    pub device: String,
    pub driver: String,
}

/// What makes this device this device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// `x86_64`, `aarch64`, ...
    pub arch: String,
    pub cpu_model: String,
    /// ISA features that select kernel paths, sorted.
    pub features: Vec<String>,
    pub clusters: Vec<Cluster>,
    pub logical_cpus: u32,
    pub caches: Vec<CacheInfo>,
    pub gpus: Vec<GpuInfo>,
}

/// Features that change which emitted path runs (a subset of cpuinfo's).
const PATH_FEATURES: &[&str] = &[
    // x86
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512vnni",
    "avx512_vnni",
    "avx_vnni",
    "avx512_fp16",
    "amx_int8",
    // aarch64
    "asimd",
    "asimddp",
    "i8mm",
    "fphp",
    "asimdhp",
    "sve",
    "sve2",
    "bf16",
];

impl Fingerprint {
    /// The fingerprint of the machine this runs on.
    pub fn detect() -> Fingerprint {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let mut fp = from_cpuinfo(&cpuinfo);
        fp.arch = std::env::consts::ARCH.to_string();
        fp.caches = read_caches();
        for cluster in &mut fp.clusters {
            cluster.max_mhz = cluster.cpus.first().and_then(|&c| read_max_mhz(c));
        }
        if fp.logical_cpus == 0 {
            fp.logical_cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        }
        fp
    }

    /// This fingerprint with `gpu` added (kept sorted, so the order GPUs
    /// are found in never changes equality).
    pub fn with_gpu(mut self, gpu: GpuInfo) -> Fingerprint {
        if !self.gpus.contains(&gpu) {
            self.gpus.push(gpu);
            self.gpus.sort();
        }
        self
    }

    /// A short stable digest (FNV-1a of the canonical JSON), for file names
    /// and log lines; equality of fingerprints compares the whole value.
    pub fn digest(&self) -> String {
        let json = serde_json::to_string(self).unwrap_or_default();
        format!("{:016x}", fnv1a(json.as_bytes()))
    }

    /// Why `self` (a record's) does not describe `current`, or `None`.
    /// Names the first field that differs.
    pub fn mismatch(&self, current: &Fingerprint) -> Option<String> {
        let fields: [(&str, String, String); 6] = [
            ("arch", self.arch.clone(), current.arch.clone()),
            (
                "cpu model",
                self.cpu_model.clone(),
                current.cpu_model.clone(),
            ),
            (
                "features",
                self.features.join(" "),
                current.features.join(" "),
            ),
            (
                "clusters",
                format!("{:?}", parts(&self.clusters)),
                format!("{:?}", parts(&current.clusters)),
            ),
            (
                "logical cpus",
                self.logical_cpus.to_string(),
                current.logical_cpus.to_string(),
            ),
            (
                "gpus",
                format!("{:?}", self.gpus),
                format!("{:?}", current.gpus),
            ),
        ];
        fields
            .into_iter()
            .find(|(_, a, b)| a != b)
            .map(|(what, a, b)| format!("{what} differ: record has `{a}`, this device has `{b}`"))
    }
}

/// Cluster identity without frequencies (which firmware may report
/// differently from boot to boot).
fn parts(clusters: &[Cluster]) -> Vec<(&str, usize)> {
    clusters
        .iter()
        .map(|c| (c.part.as_str(), c.cpus.len()))
        .collect()
}

/// 64-bit FNV-1a: a tiny, stable, dependency-free digest.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Parse `/proc/cpuinfo` text (x86 or Arm style).
pub fn from_cpuinfo(text: &str) -> Fingerprint {
    let mut model = String::new();
    let mut features: Vec<String> = Vec::new();
    // cpu number -> part (Arm "CPU part", or the model name on x86)
    let mut part_of: BTreeMap<u32, String> = BTreeMap::new();
    let mut current: Option<u32> = None;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "processor" => current = value.parse().ok(),
            "Hardware" if model.is_empty() => model = value.to_string(),
            "flags" | "Features" if features.is_empty() => {
                features = value
                    .split_whitespace()
                    .filter(|f| PATH_FEATURES.contains(f))
                    .map(str::to_string)
                    .collect();
            }
            "CPU part" | "model name" => {
                if key == "model name" && model.is_empty() {
                    model = value.to_string();
                }
                if let Some(cpu) = current {
                    part_of.insert(cpu, value.to_string());
                }
            }
            _ => {}
        }
    }
    features.sort();
    features.dedup();
    let mut clusters: Vec<Cluster> = Vec::new();
    for (cpu, part) in &part_of {
        match clusters.iter_mut().find(|c| &c.part == part) {
            Some(c) => c.cpus.push(*cpu),
            None => clusters.push(Cluster {
                part: part.clone(),
                cpus: vec![*cpu],
                max_mhz: None,
            }),
        }
    }
    if model.is_empty() {
        model = clusters.first().map(|c| c.part.clone()).unwrap_or_default();
    }
    Fingerprint {
        arch: String::new(),
        cpu_model: model,
        features,
        logical_cpus: part_of.len() as u32,
        clusters,
        caches: Vec::new(),
        gpus: Vec::new(),
    }
}

fn read_caches() -> Vec<CacheInfo> {
    let mut out = Vec::new();
    for index in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{index}");
        let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        let size = size.trim();
        let size_kib = size
            .strip_suffix('K')
            .and_then(|s| s.parse().ok())
            .or_else(|| {
                size.strip_suffix('M')
                    .and_then(|s| s.parse::<u64>().ok())
                    .map(|m| m * 1024)
            })
            .unwrap_or(0);
        out.push(CacheInfo {
            level: level.trim().parse().unwrap_or(0),
            kind: kind.trim().to_string(),
            size_kib,
        });
    }
    out.sort();
    out
}

fn read_max_mhz(cpu: u32) -> Option<u32> {
    let path = format!("/sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq");
    let khz: u32 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
    Some(khz / 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARM_BIG_LITTLE: &str = "processor\t: 0\nBogoMIPS\t: 38.40\nFeatures\t: fp asimd evtstrm aes asimddp i8mm asimdhp\nCPU implementer\t: 0x41\nCPU part\t: 0xd46\n\nprocessor\t: 1\nFeatures\t: fp asimd evtstrm aes asimddp i8mm asimdhp\nCPU part\t: 0xd46\n\nprocessor\t: 2\nFeatures\t: fp asimd asimddp i8mm asimdhp\nCPU part\t: 0xd4d\n\nHardware\t: Qualcomm Technologies, Inc SM8550\n";

    #[test]
    fn arm_clusters_by_part_number() {
        let fp = from_cpuinfo(ARM_BIG_LITTLE);
        assert_eq!(fp.clusters.len(), 2);
        assert_eq!(fp.clusters[0].part, "0xd46");
        assert_eq!(fp.clusters[0].cpus, vec![0, 1]);
        assert_eq!(fp.clusters[1].cpus, vec![2]);
        assert_eq!(fp.features, vec!["asimd", "asimddp", "asimdhp", "i8mm"]);
        assert_eq!(fp.cpu_model, "Qualcomm Technologies, Inc SM8550");
        assert_eq!(fp.logical_cpus, 3);
    }

    #[test]
    fn x86_flags_and_model() {
        let text = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx2 fma f16c avx512f\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx2 fma f16c avx512f\n";
        let fp = from_cpuinfo(text);
        assert_eq!(fp.cpu_model, "AMD EPYC 7B13");
        assert_eq!(fp.features, vec!["avx2", "avx512f", "f16c", "fma"]);
        assert_eq!(fp.clusters.len(), 1);
        assert_eq!(fp.logical_cpus, 2);
    }

    #[test]
    fn mismatch_names_the_field() {
        let a = from_cpuinfo(ARM_BIG_LITTLE);
        let mut b = a.clone();
        assert_eq!(a.mismatch(&b), None);
        b.features.retain(|f| f != "i8mm");
        let why = a.mismatch(&b).unwrap();
        assert!(why.starts_with("features differ"), "{why}");
        assert_ne!(a.digest(), b.digest());
    }

    #[test]
    fn detect_never_panics_and_sees_this_machine() {
        let fp = Fingerprint::detect();
        assert_eq!(fp.arch, std::env::consts::ARCH);
        assert!(fp.logical_cpus >= 1);
    }
}
