//! Peers that run as child processes (numpy, ggml, and implementations that
//! fix their thread count per process) and print [`PeerLine`]s as JSON lines.

use crate::error::BenchError;
use crate::method::Method;
use crate::report::{PeerLine, Record};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// A child process to run for one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCommand {
    pub peer: String,
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// What a peer printed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PeerOutput {
    pub records: Vec<Record>,
    /// (implementation, description) pairs from its info lines.
    pub info: Vec<(String, String)>,
}

/// The method as command-line flags every peer understands.
pub fn method_args(method: &Method) -> Vec<String> {
    vec![
        "--total-mib".into(),
        format!("{}", method.total_bytes as f64 / f64::from(1u32 << 20)),
        "--min-reps".into(),
        method.min_reps.to_string(),
        "--min-time".into(),
        method.min_time_s.to_string(),
        "--max-time".into(),
        method.max_time_s.to_string(),
        "--sleep-ms".into(),
        method.sleep_ms.to_string(),
    ]
}

/// One line of a peer's stdout; blank lines are `None`.
pub fn parse_line(peer: &str, line: &str) -> Result<Option<PeerLine>, BenchError> {
    let line = line.trim();
    if line.is_empty() {
        return Ok(None);
    }
    serde_json::from_str(line)
        .map(Some)
        .map_err(|e| BenchError::PeerOutput {
            peer: peer.to_string(),
            line: line.to_string(),
            why: e.to_string(),
        })
}

/// Runs `cmd`, passing its stderr through and calling `on_record` as each
/// record arrives (for progress output).
pub fn run_peer(
    cmd: &PeerCommand,
    mut on_record: impl FnMut(&Record),
) -> Result<PeerOutput, BenchError> {
    let mut child = Command::new(&cmd.program)
        .args(&cmd.args)
        .envs(cmd.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|source| BenchError::Spawn {
            peer: cmd.peer.clone(),
            program: cmd.program.clone(),
            source,
        })?;
    let mut output = PeerOutput::default();
    let mut failure = None;
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let line = match line {
                Ok(l) => l,
                Err(e) => {
                    failure = Some(BenchError::PeerOutput {
                        peer: cmd.peer.clone(),
                        line: String::new(),
                        why: e.to_string(),
                    });
                    break;
                }
            };
            match parse_line(&cmd.peer, &line) {
                Ok(Some(PeerLine::Record(r))) => {
                    on_record(&r);
                    output.records.push(r);
                }
                Ok(Some(PeerLine::Info { info, detail })) => output.info.push((info, detail)),
                Ok(None) => {}
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
    }
    if failure.is_some() {
        let _ = child.kill();
    }
    let status = child.wait().map_err(|source| BenchError::Spawn {
        peer: cmd.peer.clone(),
        program: cmd.program.clone(),
        source,
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    if !status.success() {
        return Err(BenchError::PeerFailed {
            peer: cmd.peer.clone(),
            status: status.to_string(),
        });
    }
    Ok(output)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> PeerCommand {
        PeerCommand {
            peer: "test-peer".into(),
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
            env: vec![("PEER_VAR".into(), "7".into())],
        }
    }

    #[test]
    fn records_and_info_are_collected() {
        let script = r#"echo '{"info":"p","detail":"v1"}'; echo; echo "{\"impl\":\"p\",\"n\":2,\"k\":3,\"m\":1,\"threads\":$PEER_VAR,\"median_s\":0.5,\"min_s\":0.4,\"reps\":5,\"copies\":2,\"weight_bytes\":24,\"max_rel_err\":0}""#;
        let mut seen = 0;
        let out = run_peer(&sh(script), |_| seen += 1).unwrap();
        assert_eq!(seen, 1);
        assert_eq!(out.info, [("p".to_string(), "v1".to_string())]);
        assert_eq!(out.records[0].threads, 7);
    }

    #[test]
    fn failures_are_named() {
        let err = run_peer(&sh("exit 3"), |_| {}).unwrap_err().to_string();
        assert!(err.contains("test-peer") && err.contains("exit"), "{err}");
        let err = run_peer(&sh("echo not-json"), |_| {})
            .unwrap_err()
            .to_string();
        assert!(err.contains("not-json"), "{err}");
        let mut missing = sh("");
        missing.program = "/nonexistent/peer".into();
        let err = run_peer(&missing, |_| {}).unwrap_err().to_string();
        assert!(err.contains("could not start"), "{err}");
    }

    #[test]
    fn method_flags_round_trip_the_numbers() {
        let args = method_args(&Method::standard(256 << 20));
        assert_eq!(args[..2], ["--total-mib".to_string(), "256".to_string()]);
        assert!(args.contains(&"0.4".to_string()));
    }
}
