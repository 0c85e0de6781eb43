//! The guest console protocol and its verdicts. Pure: console text in, verdicts out.
//!
//! The guest's init prints, per scenario:
//! ```text
//! SCENARIO-BEGIN <name>
//! ... any output, including data blocks:
//! DATA-BEGIN <key>              (a command's stdout; its stderr follows as block <key>-stderr)
//! ...
//! DATA-END <key> rc=<exit code>
//! VERDICT <name> PASS|FAIL|SKIP <detail>        (guest-judged scenarios)
//! SCENARIO-END <name> rc=<exit code> seconds=<n>
//! ```
//! and `VM-DONE` after the last one. Host-judged scenarios print data blocks and the host decides
//! (they may still print a guest SKIP/FAIL, which stands).
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Pass,
    Skip,
    Fail,
}

impl Status {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "PASS" => Status::Pass,
            "SKIP" => Status::Skip,
            "FAIL" => Status::Fail,
            _ => return None,
        })
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Pass => "PASS",
            Status::Skip => "SKIP",
            Status::Fail => "FAIL",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub name: String,
    pub status: Status,
    pub detail: String,
}

impl Verdict {
    pub fn new(name: &str, status: Status, detail: impl Into<String>) -> Self {
        Self {
            name: name.to_string(),
            status,
            detail: detail.into(),
        }
    }
}

/// One scenario's part of the console.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Section {
    pub name: String,
    pub lines: Vec<String>,
    /// `Some(rc)` when `SCENARIO-END` was seen.
    pub end_rc: Option<i32>,
}

impl Section {
    /// Guest `VERDICT` lines of this scenario (a verdict for another name is ignored).
    pub fn verdicts(&self) -> Vec<Verdict> {
        self.lines
            .iter()
            .filter_map(|l| {
                let mut it = l.trim_end().splitn(4, ' ');
                if it.next()? != "VERDICT" {
                    return None;
                }
                let name = it.next()?;
                let status = Status::parse(it.next()?)?;
                (name == self.name || name.starts_with(&format!("{}/", self.name)))
                    .then(|| Verdict::new(name, status, it.next().unwrap_or("").to_string()))
            })
            .collect()
    }

    /// Text of data block `key` and its rc, if the block is complete.
    pub fn data(&self, key: &str) -> Option<(String, i32)> {
        let start = self
            .lines
            .iter()
            .position(|l| l.trim_end() == format!("DATA-BEGIN {key}"))?;
        let end_prefix = format!("DATA-END {key} rc=");
        let (off, rc) = self.lines[start + 1..]
            .iter()
            .enumerate()
            .find_map(|(i, l)| {
                let rc = l.trim_end().strip_prefix(&end_prefix)?.parse().ok()?;
                Some((i, rc))
            })?;
        Some((self.lines[start + 1..start + 1 + off].join("\n"), rc))
    }
}

/// A parsed console: scenario sections in order, and whether the guest finished.
#[derive(Debug, Default)]
pub struct Console {
    pub sections: Vec<Section>,
    pub done: bool,
}

/// Splits console text into scenario sections. Carriage returns from the serial line are
/// dropped; lines outside any section are ignored.
pub fn parse(text: &str) -> Console {
    let mut c = Console::default();
    let mut cur: Option<Section> = None;
    for raw in text.lines() {
        let line = raw.trim_end_matches('\r');
        if let Some(name) = line.strip_prefix("SCENARIO-BEGIN ") {
            if let Some(s) = cur.take() {
                c.sections.push(s);
            }
            cur = Some(Section {
                name: name.trim().to_string(),
                ..Section::default()
            });
        } else if let Some(rest) = line.strip_prefix("SCENARIO-END ") {
            if let Some(mut s) = cur.take() {
                s.end_rc = rest
                    .split_whitespace()
                    .find_map(|f| f.strip_prefix("rc=")?.parse().ok());
                c.sections.push(s);
            }
        } else if line.trim_end() == "VM-DONE" {
            c.done = true;
        } else if let Some(s) = cur.as_mut() {
            s.lines.push(line.to_string());
        }
    }
    if let Some(s) = cur.take() {
        c.sections.push(s);
    }
    c
}

/// The guest's own verdicts of a section, or a FAIL saying why there are none.
pub fn guest_verdicts(s: &Section) -> Vec<Verdict> {
    let v = s.verdicts();
    if !v.is_empty() {
        return v;
    }
    let why = match s.end_rc {
        None => "scenario never finished (guest crashed or timed out)".to_string(),
        Some(143) | Some(137) => "scenario killed by its guest timeout, no verdict".to_string(),
        Some(rc) => format!("no VERDICT line (scenario exit code {rc})"),
    };
    vec![Verdict::new(&s.name, Status::Fail, why)]
}

/// Worst status of a list (PASS for an empty list).
pub fn worst(v: &[Verdict]) -> Status {
    v.iter().map(|v| v.status).max().unwrap_or(Status::Pass)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONSOLE: &str = "\
[    0.000] Linux version 6.1\r
VM-BOOTED topology=2node\r
SCENARIO-BEGIN a\r
hello\r
DATA-BEGIN x\r
{\"k\": 1}\r
DATA-END x rc=0\r
VERDICT a PASS all good here\r
VERDICT other FAIL not ours\r
SCENARIO-END a rc=0 seconds=3\r
SCENARIO-BEGIN b\r
DATA-BEGIN y\r
oops\r
SCENARIO-END b rc=1 seconds=1\r
SCENARIO-BEGIN c\r
VERDICT c/sub SKIP reason\r
SCENARIO-END c rc=143 seconds=60\r
SCENARIO-BEGIN d\r
still running\r
";

    fn check(name: &str, want: &[(&str, Status)]) {
        let c = parse(CONSOLE);
        let s = c.sections.iter().find(|s| s.name == name).unwrap();
        let got: Vec<(String, Status)> = guest_verdicts(s)
            .into_iter()
            .map(|v| (v.name, v.status))
            .collect();
        let want: Vec<(String, Status)> = want.iter().map(|(n, s)| (n.to_string(), *s)).collect();
        assert_eq!(got, want, "scenario {name}");
    }

    #[test]
    fn verdicts_per_scenario() {
        check("a", &[("a", Status::Pass)]);
        // no verdict -> FAIL (exit code 1)
        check("b", &[("b", Status::Fail)]);
        // sub-verdicts count for their scenario
        check("c", &[("c/sub", Status::Skip)]);
        // never ended -> FAIL
        check("d", &[("d", Status::Fail)]);
    }

    #[test]
    fn sections_data_and_done() {
        let c = parse(CONSOLE);
        assert!(!c.done);
        assert_eq!(c.sections.len(), 4);
        let a = &c.sections[0];
        assert_eq!(a.data("x"), Some(("{\"k\": 1}".to_string(), 0)));
        assert_eq!(a.verdicts()[0].detail, "all good here");
        assert_eq!(c.sections[1].data("y"), None, "unterminated block");
        assert_eq!(c.sections[2].end_rc, Some(143));
        assert_eq!(c.sections[3].end_rc, None);
        assert!(parse("x\nVM-DONE\r\n").done);
    }

    #[test]
    fn worst_status() {
        let v = |s| Verdict::new("x", s, "");
        assert_eq!(worst(&[]), Status::Pass);
        assert_eq!(worst(&[v(Status::Pass), v(Status::Skip)]), Status::Skip);
        assert_eq!(
            worst(&[v(Status::Fail), v(Status::Skip), v(Status::Pass)]),
            Status::Fail
        );
    }
}
