//! The `tlsgate` command: parses the command line and hands over to
//! `tlsgate-server`. Exit status 0 on a clean stop, 2 on any usage or
//! configuration error (nothing is started in that case).
#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tlsgate_config::Overrides;
use tlsgate_server::Launch;

mod bench;
mod cost;
mod xdp;

/// jemalloc for every allocation in the process, aws-lc's C ones too (it
/// replaces `malloc` itself). Measured against glibc's (docs/bench.md):
/// glibc grew and trimmed its heap around every big response, 10–14 page
/// faults per transaction from 64 KiB up (57,000 a second at 64 KiB),
/// where jemalloc keeps freed pages for reuse and took none; handshakes and
/// 64 KiB–3 MiB transactions cost ~10 % less server CPU.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// A TLS edge server: HTTPS termination, static files, metrics.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve HTTPS. Without --config: https://127.0.0.1:8443 serving the
    /// sample site with a self-signed certificate, metrics on 127.0.0.1:9090.
    Serve(ServeArgs),
    /// Validate a configuration file (certificates, keys and roots too) without serving.
    CheckConfig {
        /// The TOML file.
        file: PathBuf,
    },
    /// Measure TLS side by side with nginx and HAProxy: handshake, transfer,
    /// stream, bound, crosscheck, h2, proxy or all (see docs/bench.md).
    Bench(bench::BenchArgs),
    /// The cost of TLS on this machine: calibrate, predict, validate.
    #[command(subcommand)]
    Cost(cost::CostCommand),
    /// Internal: supervises the key server; started by `serve` itself, its
    /// standard input is the control socket.
    #[command(hide = true)]
    KeySupervisor {
        /// The process that started it (it dies with it).
        #[arg(long)]
        parent: u32,
        /// Arguments for `key-server` (the configuration to load).
        #[arg(last = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Internal: holds the private keys and signs; started by the
    /// supervisor, its standard input is its socket to the server.
    #[command(hide = true)]
    KeyServer {
        /// The supervisor (it dies with it).
        #[arg(long)]
        parent: u32,
        #[command(flatten)]
        serve: ServeArgs,
    },
    /// Manage a session ticket key file shared by several tlsgate instances
    /// (`[tls] ticket_key_file`). Files are replaced atomically, mode 0600.
    #[command(subcommand)]
    TicketKeys(TicketKeysCommand),
    /// XDP SynGate: SYN cookies answered at the driver (attach, detach, stats).
    #[command(subcommand)]
    Xdp(xdp::XdpCommand),
}

#[derive(Subcommand)]
enum TicketKeysCommand {
    /// Write a new key file (refuses to replace one without --force).
    Generate {
        /// The key file.
        file: PathBuf,
        /// Number of keys; the first encrypts, all decrypt.
        #[arg(long, value_name = "N", default_value_t = 1)]
        keys: usize,
        /// Replace an existing file (every ticket issued so far stops resuming).
        #[arg(long)]
        force: bool,
    },
    /// Put a new key in front (it encrypts from now on) and keep at most N keys,
    /// dropping the oldest. Running servers pick the change up within a second.
    Rotate {
        /// The key file.
        file: PathBuf,
        /// Keys kept, the new one included; keep enough to cover the ticket
        /// lifetime: lifetime / rotation interval + 1.
        #[arg(long, value_name = "N", default_value_t = 3)]
        keep: usize,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    /// TOML configuration file (see docs/config.md).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Listen address of the first listener; repeat for more addresses.
    #[arg(long, value_name = "ADDR")]
    listen: Vec<String>,
    /// Document root of the first listener.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Certificate chain (PEM) of the first listener; needs --key.
    #[arg(long, value_name = "PEM", requires = "key")]
    cert: Option<PathBuf>,
    /// Private key (PEM) of the first listener; needs --cert.
    #[arg(long, value_name = "PEM", requires = "cert")]
    key: Option<PathBuf>,
    /// Admin (metrics) listen address; "" disables it.
    #[arg(long, value_name = "ADDR")]
    admin: Option<String>,
    /// Worker threads (default: one per core).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    workers: Option<u16>,
}

/// The sample site shipped in the repository.
fn default_root() -> PathBuf {
    let p = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../site"));
    p.canonicalize().unwrap_or(p)
}

fn launch(a: ServeArgs) -> Launch {
    Launch {
        config_path: a.config,
        overrides: Overrides {
            listen: a.listen,
            root: a.root,
            cert: a.cert,
            key: a.key,
            admin: a.admin,
            workers: a.workers.map(usize::from),
        },
        default_root: default_root(),
    }
}

/// Standard input, which the internal processes get as their socket.
fn stdin_socket() -> std::os::unix::net::UnixStream {
    use std::os::fd::AsFd;
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .unwrap_or_else(|e| {
            eprintln!("tlsgate: internal command needs its socket on standard input: {e}");
            std::process::exit(2)
        });
    std::os::unix::net::UnixStream::from(fd)
}

/// Exit status of an internal process: logged, never with key material.
fn internal(r: std::io::Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// `RUST_LOG`, or `info` when it is unset, empty or invalid. rustls
/// warns about what clients send (an IP address as SNI, warning alerts,
/// messages out of order): a line per connection at any client's will, a
/// way to flood the log and a write per handshake. Its records are kept to
/// errors unless a directive names rustls itself (`rustls=debug`) or the
/// log is off.
fn log_filter() -> tracing_subscriber::EnvFilter {
    let asked = std::env::var("RUST_LOG").unwrap_or_default();
    let parsed = Some(asked.trim())
        .filter(|a| !a.is_empty())
        .and_then(|a| tracing_subscriber::EnvFilter::try_new(a).ok());
    let Some(filter) = parsed else {
        return tracing_subscriber::EnvFilter::new("info,rustls=error");
    };
    let directives = || asked.split(',').map(str::trim);
    let names_rustls = directives().any(|d| {
        d == "rustls"
            || d.starts_with("rustls=")
            || d.starts_with("rustls::")
            || d.starts_with("rustls[")
    });
    let off = directives().any(|d| d.eq_ignore_ascii_case("off"));
    match "rustls=error".parse() {
        Ok(quiet) if !names_rustls && !off => filter.add_directive(quiet),
        _ => filter,
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(log_filter())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => return bench::run(args),
        Command::Cost(cmd) => return cost::run(cmd),
        Command::Serve(a) => tlsgate_server::run(launch(a)),
        Command::CheckConfig { file } => tlsgate_server::check(&Launch {
            config_path: Some(file.clone()),
            overrides: Overrides::default(),
            default_root: default_root(),
        })
        .map(|c| {
            println!(
                "{}: OK ({} listener(s), {} worker(s))",
                file.display(),
                c.listeners.len(),
                c.workers
            );
        }),
        Command::TicketKeys(cmd) => return ticket_keys(cmd),
        Command::Xdp(cmd) => return xdp::run(cmd),
        Command::KeySupervisor { parent, args } => {
            return internal(tlsgate_keyserver::server::supervise(
                stdin_socket(),
                parent,
                args,
            ));
        }
        Command::KeyServer { parent, serve } => {
            let launch = launch(serve);
            // Before any key is read: no core file and no reader of the
            // same user (exec made this process dumpable again).
            let undumpable =
                tlsgate_sys::privileges::set_dumpable(false).map_err(std::io::Error::other);
            return internal(
                undumpable
                    .and_then(|()| tlsgate_sys::ipc::die_with_parent(parent))
                    .and_then(|()| {
                        tlsgate_keyserver::server::serve(stdin_socket(), move || launch.load())
                    }),
            );
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tlsgate: error: {e}");
            ExitCode::from(2)
        }
    }
}

fn ticket_keys(cmd: TicketKeysCommand) -> ExitCode {
    use tlsgate_tls::tickets::file;
    let result = match cmd {
        TicketKeysCommand::Generate {
            file: path,
            keys,
            force,
        } => file::generate(&path, keys, force)
            .map(|()| format!("{}: wrote {keys} new key(s)", path.display())),
        TicketKeysCommand::Rotate { file: path, keep } => file::rotate(&path, keep).map(|r| {
            format!(
                "{}: new key in front; {} key(s), {} dropped",
                path.display(),
                r.kept,
                r.dropped
            )
        }),
    };
    match result {
        Ok(msg) => {
            println!("{msg}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tlsgate: error: {e}");
            ExitCode::from(2)
        }
    }
}
