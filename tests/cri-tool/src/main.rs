//! Test-only CRI client: creates pods and containers through containerd's CRI exactly as
//! kubelet would with the cgroupfs driver (host network, a `cgroup_parent` per pod under
//! `/kubepods/<qos>/pod<uid>`, container resources as kubelet computes them), and prints the
//! ids. Specs are JSON on the command line so tests stay readable.
use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use serde::Deserialize;

#[allow(clippy::all)]
pub mod cri {
    tonic::include_proto!("runtime.v1");
}
use cri::runtime_service_client::RuntimeServiceClient;

const IMAGE: &str = "docker.io/library/rb-busybox:test";

#[derive(Parser)]
#[command(
    name = "cri-tool",
    about = "Drive a CRI runtime as kubelet would (test tool)"
)]
struct Cli {
    /// The runtime's CRI socket.
    #[arg(long)]
    socket: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// RunPodSandbox from a PodSpec JSON; prints the sandbox id.
    Pod {
        spec: String,
    },
    /// CreateContainer from a ContainerSpec JSON; prints the container id.
    Container {
        spec: String,
    },
    Start {
        id: String,
    },
    /// UpdateContainerResources (kubelet's in-place resize) from a JSON of cpu_quota,
    /// cpu_period, cpu_shares, memory_limit; fails with the runtime's error.
    Update {
        id: String,
        spec: String,
    },
    Stop {
        id: String,
    },
    Rm {
        id: String,
    },
    StopPod {
        id: String,
    },
    RmPod {
        id: String,
    },
    /// Lists containers as JSON lines: id, pod id, name, state.
    Ps,
    /// ExecSync: runs `cmd` in the container (10 s at most); prints its stdout, fails with
    /// its stderr when it exits non-zero.
    Exec {
        id: String,
        #[arg(required = true, trailing_var_arg = true)]
        cmd: Vec<String>,
    },
    /// ContainerStatus (verbose): the runtime's view of a container's cpuset as JSON —
    /// `cpus` / `mems` from its status resources, `spec_cpus` / `spec_mems` from the OCI spec
    /// the runtime keeps (containerd's verbose info).
    Inspect {
        id: String,
    },
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PodSpec {
    name: String,
    uid: String,
    /// guaranteed | burstable | besteffort
    qos: String,
    log_dir: String,
    #[serde(default)]
    namespace: Option<String>,
    /// The pod's annotations (kubelet passes them to the sandbox; NRI shows them to plugins).
    #[serde(default)]
    annotations: HashMap<String, String>,
    /// `hostPID: true`: the pod shares the host's PID namespace.
    #[serde(default)]
    host_pid: bool,
    /// The pod's totals as kubelet ≥ 1.26 sets them on the sandbox (`linux.resources`: the sums
    /// of its containers' requests and limits), which containerd passes to NRI plugins as
    /// `PodSandbox.linux.pod_resources`.
    #[serde(default)]
    resources: Option<PodResources>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PodResources {
    #[serde(default)]
    cpu_quota: i64,
    #[serde(default)]
    cpu_period: i64,
    #[serde(default)]
    cpu_shares: i64,
    #[serde(default)]
    memory_limit: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ContainerSpec {
    pod_id: String,
    pod: PodSpec,
    name: String,
    #[serde(default)]
    cpu_quota: i64,
    #[serde(default)]
    cpu_period: i64,
    #[serde(default)]
    cpu_shares: i64,
    #[serde(default)]
    memory_limit: i64,
    #[serde(default)]
    hugepages_2m: u64,
    /// The image's entrypoint when empty (kubelet: `command` unset).
    #[serde(default)]
    command: Vec<String>,
    #[serde(default)]
    args: Vec<String>,
    /// Relative to the pod's log_dir.
    log_path: String,
    /// Default: the test busybox image.
    #[serde(default)]
    image: Option<String>,
    #[serde(default)]
    env: Vec<(String, String)>,
    #[serde(default)]
    mounts: Vec<MountSpec>,
    /// Device nodes as kubelet hands a device plugin's devices to the runtime.
    #[serde(default)]
    devices: Vec<DeviceSpec>,
    #[serde(default)]
    security: SecuritySpec,
}

/// A host device node given to the container (CRI `Device`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceSpec {
    host_path: String,
    container_path: String,
    /// cgroup permissions, e.g. "rw" (default "rwm").
    #[serde(default)]
    permissions: Option<String>,
}

/// A volume mount as kubelet hands it to the runtime (hostPath and configMap alike: a host
/// directory bound into the container).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MountSpec {
    host_path: String,
    container_path: String,
    #[serde(default)]
    readonly: bool,
}

/// The container's securityContext as kubelet translates it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SecuritySpec {
    #[serde(default)]
    add_capabilities: Vec<String>,
    #[serde(default)]
    drop_capabilities: Vec<String>,
    #[serde(default)]
    readonly_rootfs: bool,
    /// `allowPrivilegeEscalation: false`.
    #[serde(default)]
    no_new_privs: bool,
    /// `seccompProfile: {type: RuntimeDefault}`.
    #[serde(default)]
    seccomp_runtime_default: bool,
}

fn sandbox_config(p: &PodSpec) -> Result<cri::PodSandboxConfig> {
    let parent = match p.qos.as_str() {
        "guaranteed" => format!("/kubepods/pod{}", p.uid),
        "burstable" => format!("/kubepods/burstable/pod{}", p.uid),
        "besteffort" => format!("/kubepods/besteffort/pod{}", p.uid),
        q => bail!("qos {q:?}: guaranteed, burstable or besteffort"),
    };
    let ns = p.namespace.clone().unwrap_or_else(|| "default".into());
    let labels = HashMap::from([
        ("io.kubernetes.pod.name".to_string(), p.name.clone()),
        ("io.kubernetes.pod.namespace".to_string(), ns.clone()),
        ("io.kubernetes.pod.uid".to_string(), p.uid.clone()),
    ]);
    Ok(cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: p.name.clone(),
            uid: p.uid.clone(),
            namespace: ns,
            attempt: 0,
        }),
        // Host network: no hostname (runc refuses one without a UTS namespace).
        hostname: String::new(),
        log_directory: p.log_dir.clone(),
        labels,
        annotations: p.annotations.clone(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: parent,
            resources: p.resources.as_ref().map(|r| cri::LinuxContainerResources {
                cpu_period: r.cpu_period,
                cpu_quota: r.cpu_quota,
                cpu_shares: r.cpu_shares,
                memory_limit_in_bytes: r.memory_limit,
                ..Default::default()
            }),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(host_network(p.host_pid)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn host_network(host_pid: bool) -> cri::NamespaceOption {
    let pid = if host_pid {
        cri::NamespaceMode::Node
    } else {
        cri::NamespaceMode::Container
    };
    cri::NamespaceOption {
        network: cri::NamespaceMode::Node as i32,
        pid: pid as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

async fn client(socket: &str) -> Result<RuntimeServiceClient<tonic::transport::Channel>> {
    let path = socket.to_string();
    let ch = tonic::transport::Endpoint::try_from("http://[::1]:50051")?
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let p = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(p).await?,
                ))
            }
        }))
        .await
        .with_context(|| format!("connecting to {socket}"))?;
    Ok(RuntimeServiceClient::new(ch))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let mut c = client(&cli.socket).await?;
    match cli.cmd {
        Cmd::Pod { spec } => {
            let p: PodSpec = serde_json::from_str(&spec).context("pod spec")?;
            let r = c
                .run_pod_sandbox(cri::RunPodSandboxRequest {
                    config: Some(sandbox_config(&p)?),
                    runtime_handler: String::new(),
                })
                .await?;
            println!("{}", r.into_inner().pod_sandbox_id);
        }
        Cmd::Container { spec } => {
            let s: ContainerSpec = serde_json::from_str(&spec).context("container spec")?;
            let resources = cri::LinuxContainerResources {
                cpu_period: s.cpu_period,
                cpu_quota: s.cpu_quota,
                cpu_shares: s.cpu_shares,
                memory_limit_in_bytes: s.memory_limit,
                hugepage_limits: if s.hugepages_2m > 0 {
                    vec![cri::HugepageLimit {
                        page_size: "2MB".into(),
                        limit: s.hugepages_2m,
                    }]
                } else {
                    vec![]
                },
                ..Default::default()
            };
            let labels = HashMap::from([
                ("io.kubernetes.pod.name".to_string(), s.pod.name.clone()),
                ("io.kubernetes.pod.uid".to_string(), s.pod.uid.clone()),
                ("io.kubernetes.container.name".to_string(), s.name.clone()),
            ]);
            let config = cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: s.name.clone(),
                    attempt: 0,
                }),
                image: Some(cri::ImageSpec {
                    image: s.image.clone().unwrap_or_else(|| IMAGE.into()),
                    ..Default::default()
                }),
                command: s.command.clone(),
                args: s.args.clone(),
                envs: s
                    .env
                    .iter()
                    .map(|(key, value)| cri::KeyValue {
                        key: key.clone(),
                        value: value.clone(),
                    })
                    .collect(),
                mounts: s
                    .mounts
                    .iter()
                    .map(|m| cri::Mount {
                        container_path: m.container_path.clone(),
                        host_path: m.host_path.clone(),
                        readonly: m.readonly,
                        ..Default::default()
                    })
                    .collect(),
                devices: s
                    .devices
                    .iter()
                    .map(|d| cri::Device {
                        container_path: d.container_path.clone(),
                        host_path: d.host_path.clone(),
                        permissions: d.permissions.clone().unwrap_or_else(|| "rwm".into()),
                    })
                    .collect(),
                log_path: s.log_path.clone(),
                labels,
                linux: Some(cri::LinuxContainerConfig {
                    resources: Some(resources),
                    security_context: Some(cri::LinuxContainerSecurityContext {
                        namespace_options: Some(host_network(s.pod.host_pid)),
                        capabilities: Some(cri::Capability {
                            add_capabilities: s.security.add_capabilities.clone(),
                            drop_capabilities: s.security.drop_capabilities.clone(),
                            ..Default::default()
                        }),
                        readonly_rootfs: s.security.readonly_rootfs,
                        no_new_privs: s.security.no_new_privs,
                        seccomp: Some(cri::SecurityProfile {
                            profile_type: if s.security.seccomp_runtime_default {
                                cri::security_profile::ProfileType::RuntimeDefault
                            } else {
                                cri::security_profile::ProfileType::Unconfined
                            } as i32,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            };
            let r = c
                .create_container(cri::CreateContainerRequest {
                    pod_sandbox_id: s.pod_id.clone(),
                    config: Some(config),
                    sandbox_config: Some(sandbox_config(&s.pod)?),
                })
                .await?;
            println!("{}", r.into_inner().container_id);
        }
        Cmd::Start { id } => {
            c.start_container(cri::StartContainerRequest { container_id: id })
                .await?;
        }
        Cmd::Update { id, spec } => {
            let r: PodResources = serde_json::from_str(&spec).context("resources")?;
            c.update_container_resources(cri::UpdateContainerResourcesRequest {
                container_id: id,
                linux: Some(cri::LinuxContainerResources {
                    cpu_period: r.cpu_period,
                    cpu_quota: r.cpu_quota,
                    cpu_shares: r.cpu_shares,
                    memory_limit_in_bytes: r.memory_limit,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await?;
        }
        Cmd::Exec { id, cmd } => {
            let r = c
                .exec_sync(cri::ExecSyncRequest {
                    container_id: id,
                    cmd,
                    timeout: 10,
                })
                .await?
                .into_inner();
            if r.exit_code != 0 {
                bail!(
                    "exit code {}: {}",
                    r.exit_code,
                    String::from_utf8_lossy(&r.stderr)
                );
            }
            print!("{}", String::from_utf8_lossy(&r.stdout));
        }
        Cmd::Stop { id } => {
            c.stop_container(cri::StopContainerRequest {
                container_id: id,
                timeout: 2,
            })
            .await?;
        }
        Cmd::Rm { id } => {
            c.remove_container(cri::RemoveContainerRequest { container_id: id })
                .await?;
        }
        Cmd::StopPod { id } => {
            c.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: id })
                .await?;
        }
        Cmd::RmPod { id } => {
            c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
                .await?;
        }
        Cmd::Inspect { id } => {
            let r = c
                .container_status(cri::ContainerStatusRequest {
                    container_id: id,
                    verbose: true,
                })
                .await?
                .into_inner();
            let linux = r
                .status
                .and_then(|s| s.resources)
                .and_then(|r| r.linux)
                .unwrap_or_default();
            let info: serde_json::Value = r
                .info
                .get("info")
                .map(|i| serde_json::from_str(i))
                .transpose()
                .context("the runtime's verbose info")?
                .unwrap_or_default();
            let cpu = &info["runtimeSpec"]["linux"]["resources"]["cpu"];
            println!(
                "{}",
                serde_json::json!({
                    "cpus": linux.cpuset_cpus,
                    "mems": linux.cpuset_mems,
                    "spec_cpus": cpu["cpus"],
                    "spec_mems": cpu["mems"],
                })
            );
        }
        Cmd::Ps => {
            let r = c
                .list_containers(cri::ListContainersRequest { filter: None })
                .await?;
            for k in r.into_inner().containers {
                println!(
                    "{}",
                    serde_json::json!({
                        "id": k.id,
                        "pod_id": k.pod_sandbox_id,
                        "name": k.metadata.map(|m| m.name).unwrap_or_default(),
                        "state": k.state,
                    })
                );
            }
        }
    }
    Ok(())
}
