//! The Kubernetes manifests in deploy/kubernetes/: every file passes the
//! Kubernetes schema validator (`kubernetes-validate --strict`, its schemas
//! bundled, so it works offline; installed by `./dev setup`) and a broken
//! copy does not; the ConfigMap's configuration passes `tlsgate
//! check-config` with files laid out as the pod mounts them; the CronJob's
//! rotation script, run as written against a directory shaped like a
//! Secret volume, rotates the key file the way `tlsgate ticket-keys rotate`
//! does and leaves the patch its `store` container sends; and the names
//! that tie the pieces together (Secret, mount paths, RBAC) agree.
//!
//! A missing validator is a failure, never a skip.

#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

use common::{bin, Server};

fn manifests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

/// Where `./dev setup` installs the validator (a virtualenv of its own);
/// `TLSGATE_KUBERNETES_VALIDATE_VENV` names another.
fn venv() -> PathBuf {
    let dir = std::env::var_os("TLSGATE_KUBERNETES_VALIDATE_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/local/lib/tlsgate-kubernetes-validate"));
    let validator = dir.join("bin/kubernetes-validate");
    assert!(
        validator.is_file(),
        "{} is missing: run ./dev setup (it installs the Kubernetes schema validator)",
        validator.display()
    );
    dir
}

fn validate(files: &[PathBuf]) -> Output {
    Command::new(venv().join("bin/kubernetes-validate"))
        .arg("--strict")
        .args(files)
        .output()
        .unwrap()
}

/// The YAML documents of a file, as JSON, parsed by the validator's own
/// Python (PyYAML, which it parses with): what the validator sees.
fn documents(path: &Path) -> Vec<Value> {
    let out = Command::new(venv().join("bin/python"))
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))",
        ])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()
}

fn yaml_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(manifests())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    v.sort();
    v
}

/// The one resource of `kind` among all the manifests.
fn resource(kind: &str) -> Value {
    let found: Vec<Value> = yaml_files()
        .iter()
        .flat_map(|f| documents(f))
        .filter(|d| d["kind"] == kind)
        .collect();
    assert_eq!(found.len(), 1, "{kind}: {found:?}");
    found.into_iter().next().unwrap()
}

#[test]
fn every_manifest_passes_the_schema_validator() {
    let files = yaml_files();
    let mut kinds: Vec<String> = Vec::new();
    let mut resources = 0;
    for f in &files {
        for d in documents(f) {
            kinds.push(d["kind"].as_str().unwrap().to_string());
            resources += 1;
        }
    }
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ConfigMap",
            "CronJob",
            "DaemonSet",
            "Deployment",
            "Namespace",
            "NetworkPolicy",
            "Role",
            "RoleBinding",
            "Secret",
            "Service",
            "ServiceAccount"
        ]
    );
    let out = validate(&files);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    // Every resource was checked against a schema, none skipped.
    assert_eq!(
        text.matches(" passed for resource ").count(),
        resources,
        "{text}"
    );
}

#[test]
fn a_broken_manifest_fails_the_schema_validator() {
    let dir = tempfile::tempdir().unwrap();
    let deployment = std::fs::read_to_string(manifests().join("deployment.yaml")).unwrap();
    for (name, from, to, complaint) in [
        // A wrong type.
        (
            "type.yaml",
            "replicas: 3",
            "replicas: \"three\"",
            "'three' is not of type 'integer'",
        ),
        // A misspelt optional field (strict: unknown properties are errors).
        (
            "field.yaml",
            "readOnlyRootFilesystem: true",
            "readOnlyRootFileSystem: true",
            "'readOnlyRootFileSystem' was unexpected",
        ),
    ] {
        assert!(deployment.contains(from), "{from}");
        let path = dir.path().join(name);
        std::fs::write(&path, deployment.replacen(from, to, 1)).unwrap();
        let out = validate(std::slice::from_ref(&path));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{name} passed:\n{text}");
        assert!(text.contains(complaint), "{name}: {text}");
    }
}

/// A directory laid out as the kubelet lays out a Secret or ConfigMap
/// volume: the files in a timestamped directory, `..data` a symlink to it,
/// each name a symlink through `..data`.
fn volume_like(dir: &Path, files: &[(&str, &[u8], u32)]) {
    let data = dir.join("..2026_11_25_01_00_00.000000001");
    std::fs::create_dir_all(&data).unwrap();
    for (name, bytes, mode) in files {
        let p = data.join(name);
        std::fs::write(&p, bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).unwrap();
        symlink(format!("..data/{name}"), dir.join(name)).unwrap();
    }
    symlink(data.file_name().unwrap(), dir.join("..data")).unwrap();
}

/// The pod's file system under `root`: `path` as the container sees it.
fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

fn volume_mounts(container: &Value) -> Vec<(String, String)> {
    container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap().to_string(),
                m["mountPath"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn secret_of_volume(pod: &Value, volume: &str) -> String {
    pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == volume)
        .and_then(|v| v["secret"]["secretName"].as_str())
        .unwrap_or_else(|| panic!("no Secret volume {volume}"))
        .to_string()
}

fn keys_of(text: &str) -> Vec<String> {
    text.lines()
        .skip(1)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn generate_keys(path: &Path, n: usize) {
    let out = Command::new(bin())
        .args(["ticket-keys", "generate"])
        .arg(path)
        .args(["--keys", &n.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// The ConfigMap's tlsgate.toml with the pod's absolute paths moved under
/// `root`, and the upstream's Service name (resolved at load) pointed at
/// this machine.
fn config_under(root: &Path) -> String {
    let cm = resource("ConfigMap");
    let text = cm["data"]["tlsgate.toml"].as_str().unwrap();
    for path in ["/etc/tlsgate/", "/srv/www"] {
        assert!(text.contains(path), "{path}");
    }
    text.replace("/etc/tlsgate/", &format!("{}/etc/tlsgate/", root.display()))
        .replace("\"/srv/www\"", &format!("\"{}/srv/www\"", root.display()))
        .replace("app.default.svc.cluster.local", "localhost")
}

/// Lays out the Deployment's mounts under `root` (ConfigMap, TLS Secret,
/// ticket key Secret as given) and returns the config's path.
fn pod_files(root: &Path, ticket_keys: &[u8]) -> PathBuf {
    let deployment = resource("Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let mounts = volume_mounts(container);
    let mount = |name: &str| {
        mounts
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.clone())
            .unwrap()
    };
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(vec!["edge.example.com".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    volume_like(
        &under(root, &mount("tls")),
        &[
            ("tls.crt", cert.pem().as_bytes(), 0o400),
            ("tls.key", key.serialize_pem().as_bytes(), 0o400),
        ],
    );
    volume_like(
        &under(root, &mount("ticket-keys")),
        &[("ticket.keys", ticket_keys, 0o400)],
    );
    let config = config_under(root);
    volume_like(
        &under(root, &mount("config")),
        &[("tlsgate.toml", config.as_bytes(), 0o644)],
    );
    std::fs::create_dir_all(under(root, "/srv/www")).unwrap();
    // The container's arguments name the file where the ConfigMap puts it.
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let at = args.iter().position(|a| *a == "--config").unwrap();
    under(root, args[at + 1])
}

#[test]
fn the_configmaps_config_passes_check_config_and_the_placeholder_secret_does_not() {
    let root = tempfile::tempdir().unwrap();
    let keys = root.path().join("generated.keys");
    generate_keys(&keys, 1);
    let config = pod_files(root.path(), &std::fs::read(&keys).unwrap());
    assert_ok(
        &Command::new(bin())
            .arg("check-config")
            .arg(&config)
            .output()
            .unwrap(),
    );

    // The committed Secret holds a placeholder that tlsgate refuses, so a
    // deployment that forgot to make real keys does not start with
    // published ones.
    let secret = resource("Secret");
    let placeholder = secret["stringData"]["ticket.keys"].as_str().unwrap();
    let root = tempfile::tempdir().unwrap();
    let config = pod_files(root.path(), placeholder.as_bytes());
    let out = Command::new(bin())
        .arg("check-config")
        .arg(&config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("ticket_key_file"), "{err}");
}

#[test]
fn the_cronjob_rotates_a_secret_shaped_key_file_and_patches_the_secret_the_servers_mount() {
    let cron = resource("CronJob");
    let pod = &cron["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    let rotate = &pod["initContainers"][0];
    let store = &pod["containers"][0];
    assert_eq!(rotate["name"], "rotate");
    assert_eq!(store["name"], "store");

    // The file system of the Job's pod, its mounts laid out as the kubelet
    // does: the Secret's file readable by the pod's group (fsGroup: 0440).
    let root = tempfile::tempdir().unwrap();
    let before = root.path().join("before.keys");
    generate_keys(&before, 2);
    let before_keys = keys_of(&std::fs::read_to_string(&before).unwrap());
    let mut script_mounts = volume_mounts(rotate);
    let secret_volume = script_mounts
        .iter()
        .find(|(n, _)| {
            pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["name"] == *n && v["secret"].is_object())
        })
        .cloned()
        .unwrap();
    let secret_name = secret_of_volume(pod, &secret_volume.0);
    volume_like(
        &under(root.path(), &secret_volume.1),
        &[("ticket.keys", &std::fs::read(&before).unwrap(), 0o440)],
    );
    script_mounts.retain(|m| *m != secret_volume);
    for (_, path) in &script_mounts {
        // An emptyDir as the kubelet makes it: mode 0777, and with the
        // pod's fsGroup the setgid bit; no sticky bit.
        let dir = under(root.path(), path);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o2777)).unwrap();
    }

    // The script as written, its absolute mount paths moved under the
    // temporary root, `tlsgate` on PATH being this build.
    let command: Vec<String> = rotate["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert_eq!(command[..2], ["/bin/sh".to_string(), "-ec".to_string()]);
    let mut script = command[2].clone();
    for (_, path) in volume_mounts(rotate) {
        script = script.replace(&path, &under(root.path(), &path).display().to_string());
    }
    let bin_dir = root.path().join("bin");
    std::fs::create_dir(&bin_dir).unwrap();
    symlink(bin(), bin_dir.join("tlsgate")).unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = || {
        assert_ok(
            &Command::new("/bin/sh")
                .args(["-ec", &script])
                .env("PATH", &path)
                .output()
                .unwrap(),
        )
    };
    run();

    let work = under(root.path(), "/work");
    let rotated = std::fs::read_to_string(work.join("ticket.keys")).unwrap();
    let keys = keys_of(&rotated);
    // A new key in front; the old ones after it, in order.
    assert_eq!(keys.len(), 3, "{rotated}");
    assert!(!before_keys.contains(&keys[0]), "{rotated}");
    assert_eq!(keys[1..], before_keys[..], "{rotated}");
    let mode = std::fs::metadata(work.join("ticket.keys"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    // The patch carries exactly that file, under the Secret's key.
    let patch: Value =
        serde_json::from_slice(&std::fs::read(work.join("patch.json")).unwrap()).unwrap();
    let b64 = patch["data"]["ticket.keys"].as_str().unwrap();
    let decoded = Command::new("base64")
        .arg("-d")
        .stdin(
            std::fs::File::open({
                let p = root.path().join("patch.b64");
                std::fs::write(&p, b64).unwrap();
                p
            })
            .unwrap(),
        )
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&decoded.stdout), rotated);

    // --keep bounds the file: run the rotation many times over its own output.
    let keep: usize = command[2]
        .split("--keep")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    // Hourly, and enough keys for the configured ticket lifetime plus one.
    assert_eq!(cron["spec"]["schedule"], "0 * * * *");
    let config = resource("ConfigMap")["data"]["tlsgate.toml"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(config.contains("ticket_lifetime = \"12h\""), "{config}");
    assert!(keep > 12 + 1, "keep {keep}");
    let secret_dir = under(root.path(), &secret_volume.1);
    for _ in 0..keep + 2 {
        let data = std::fs::read_link(secret_dir.join("..data")).unwrap();
        let f = secret_dir.join(&data).join("ticket.keys");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        std::fs::copy(work.join("ticket.keys"), &f).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o440)).unwrap();
        run();
    }
    let last = keys_of(&std::fs::read_to_string(work.join("ticket.keys")).unwrap());
    assert_eq!(last.len(), keep);

    // The store container sends that patch to that Secret.
    let args: Vec<&str> = store["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(store["command"][0], "kubectl");
    assert!(
        args.contains(&"patch") && args.contains(&"secret"),
        "{args:?}"
    );
    assert!(args.contains(&secret_name.as_str()), "{args:?}");
    assert!(args.contains(&"--patch-file=/work/patch.json"), "{args:?}");
    assert!(volume_mounts(store).contains(&("work".into(), "/work".into())));

    // The servers mount that Secret where the config reads the key file.
    for kind in ["Deployment", "DaemonSet"] {
        let spec = &resource(kind)["spec"]["template"]["spec"];
        assert_eq!(secret_of_volume(spec, "ticket-keys"), secret_name, "{kind}");
        let mounts = volume_mounts(&spec["containers"][0]);
        let (_, at) = mounts.iter().find(|(n, _)| n == "ticket-keys").unwrap();
        assert!(
            config.contains(&format!("ticket_key_file = \"{at}/ticket.keys\"")),
            "{kind}: {at}"
        );
    }

    // RBAC: the Job's service account may get and patch that Secret only.
    let sa = pod["serviceAccountName"].as_str().unwrap();
    assert_eq!(resource("ServiceAccount")["metadata"]["name"], sa);
    let role = resource("Role");
    let rules = role["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0]["resources"], serde_json::json!(["secrets"]));
    assert_eq!(rules[0]["resourceNames"], serde_json::json!([secret_name]));
    assert_eq!(rules[0]["verbs"], serde_json::json!(["get", "patch"]));
    let binding = resource("RoleBinding");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["name"], sa);
}

/// A capability set from /proc/PID/status ("CapEff", "CapBnd"...).
fn capabilities(pid: u32, set: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{set}:")))
        .unwrap();
    u64::from_str_radix(line.trim(), 16).unwrap()
}

/// The pod as the Deployment runs it: the ConfigMap's file, the Secrets
/// laid out as the kubelet does, every capability dropped (as the
/// container's `capabilities.drop: [ALL]` leaves uid 0), and the listen
/// addresses overridden as the DaemonSet does (free ports here). It
/// serves, and picks up a rotated key file when the kubelet swaps the
/// volume's `..data` link, without a signal.
#[test]
fn the_pod_serves_without_capabilities_and_follows_a_kubelet_style_key_update() {
    let root = tempfile::tempdir().unwrap();
    let keys = root.path().join("generated.keys");
    generate_keys(&keys, 1);
    let config = pod_files(root.path(), &std::fs::read(&keys).unwrap());
    let config = config.to_str().unwrap();
    let server = Server::spawn_under(
        &[
            "setpriv",
            "--bounding-set=-all",
            "--inh-caps=-all",
            "--ambient-caps=-all",
        ],
        &[
            "serve",
            "--config",
            config,
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ],
    );
    assert_eq!(capabilities(server.pid(), "CapBnd"), 0, "{}", server.log());
    assert_eq!(capabilities(server.pid(), "CapEff"), 0);
    assert!(server.admin_get("/healthz").starts_with("HTTP/1.1 200"));
    // A TLS exchange with the proxy route (no upstream runs here: an
    // error status from tlsgate, over TLS, is the answer).
    let url = server.url("/");
    let out = server.curl(&["-o", "/dev/null", "-w", "%{http_code}", &url]);
    let code = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(code.starts_with('5'), "{code}: {}", server.log());

    // The kubelet's update: the new files in a new directory, then `..data`
    // swapped to it with one rename.
    let tickets = under(root.path(), "/etc/tlsgate/tickets");
    let rotated = root.path().join("rotated.keys");
    std::fs::copy(&keys, &rotated).unwrap();
    let out = Command::new(bin())
        .args(["ticket-keys", "rotate"])
        .arg(&rotated)
        .output()
        .unwrap();
    assert_ok(&out);
    let data = tickets.join("..2026_11_25_02_00_00.000000002");
    std::fs::create_dir(&data).unwrap();
    std::fs::copy(&rotated, data.join("ticket.keys")).unwrap();
    std::fs::set_permissions(
        data.join("ticket.keys"),
        std::fs::Permissions::from_mode(0o400),
    )
    .unwrap();
    symlink(data.file_name().unwrap(), tickets.join("..data_tmp")).unwrap();
    std::fs::rename(tickets.join("..data_tmp"), tickets.join("..data")).unwrap();
    server.wait_log("ticket keys reloaded from", Duration::from_secs(10));
    assert!(server.log().contains(": 2 keys"), "{}", server.log());
    server.expect_metric_line("tlsgate_ticket_key_reloads_total{result=\"ok\"} 1");
}
