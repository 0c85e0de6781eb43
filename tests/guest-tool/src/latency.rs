//! `latency`: the daemon's responsiveness while a control round runs. Two clients at once for
//! `seconds`: one admits a small pod over the admission socket and releases it (the admit is
//! timed, connect to last byte), one GETs `/healthz` over TCP. Every request prints
//! `LAT <admit|healthz> <wall seconds of day> <micros> <http status>` (a request that fails to
//! connect or times out prints status 0 and the time until it gave up); the scenario matches
//! those lines against the round's start and end in the daemon's log.
use std::{
    io::{Read, Write},
    net::TcpStream,
    os::unix::net::UnixStream,
    path::Path,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::Result;

fn day_secs() -> f64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs() % 86_400) as f64 + f64::from(d.subsec_micros()) / 1e6
}

/// One HTTP/1.1 request on a fresh stream; the status code, 0 on any failure.
fn exchange(mut s: impl Read + Write, req: &str) -> u16 {
    if s.write_all(req.as_bytes()).is_err() {
        return 0;
    }
    let mut out = Vec::new();
    if s.read_to_end(&mut out).is_err() {
        return 0;
    }
    let text = String::from_utf8_lossy(&out);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn request(method: &str, target: &str, body: &str) -> String {
    format!(
        "{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn unix(sock: &Path, req: &str) -> u16 {
    match UnixStream::connect(sock) {
        Ok(s) => {
            let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
            exchange(s, req)
        }
        Err(_) => 0,
    }
}

pub fn run(sock: &Path, healthz: &str, seconds: f64, interval_ms: u64) -> Result<()> {
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let pause = Duration::from_millis(interval_ms);
    let sock = sock.to_path_buf();
    let admit = std::thread::spawn(move || {
        let mut i = 0u64;
        while Instant::now() < end {
            let uid = format!("lat-{i}");
            let body = format!(
                r#"{{"uid":"{uid}","containers":[{{"name":"c","cpu_request_millis":100}}]}}"#
            );
            let (at, t0) = (day_secs(), Instant::now());
            let code = unix(&sock, &request("POST", "/v1/admit", &body));
            println!("LAT admit {at:.6} {} {code}", t0.elapsed().as_micros());
            unix(&sock, &request("DELETE", &format!("/v1/pods/{uid}"), ""));
            i += 1;
            std::thread::sleep(pause);
        }
    });
    let addr = healthz.to_string();
    let health = std::thread::spawn(move || {
        while Instant::now() < end {
            let (at, t0) = (day_secs(), Instant::now());
            let code = match TcpStream::connect(&addr) {
                Ok(s) => {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
                    exchange(s, &request("GET", "/healthz", ""))
                }
                Err(_) => 0,
            };
            println!("LAT healthz {at:.6} {} {code}", t0.elapsed().as_micros());
            std::thread::sleep(pause);
        }
    });
    let _ = admit.join();
    let _ = health.join();
    Ok(())
}
