//! Compiles the XDP program (bpf/syngate.bpf.c) with clang into OUT_DIR,
//! where `include_bytes_aligned!` embeds it in the crate.
//!
//! Needs clang with the BPF target and the kernel's UAPI and libbpf
//! headers (Debian: clang, linux-libc-dev, libbpf-dev; `./dev setup`
//! installs them). `TLSGATE_CLANG` overrides the compiler.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo"));
    let src = manifest.join("bpf/syngate.bpf.c");
    println!("cargo:rerun-if-changed=bpf/syngate.bpf.c");
    println!("cargo:rerun-if-changed=bpf/syngate.h");
    println!("cargo:rerun-if-env-changed=TLSGATE_CLANG");
    let clang = std::env::var("TLSGATE_CLANG").unwrap_or_else(|_| "clang".into());
    // Debian keeps asm/types.h under the multiarch directory, which the
    // BPF target does not search by itself.
    let multiarch = format!(
        "/usr/include/{}-linux-gnu",
        std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into())
    );
    compile(&clang, &multiarch, &src, &out.join("syngate.bpf.o"));
    // The bench's sink for the client end of its veth pair.
    println!("cargo:rerun-if-changed=bpf/sink.bpf.c");
    compile(
        &clang,
        &multiarch,
        &manifest.join("bpf/sink.bpf.c"),
        &out.join("sink.bpf.o"),
    );
    // The SYN flood generator's XDP mode (BPF_PROG_RUN, live frames).
    println!("cargo:rerun-if-changed=bpf/flood.bpf.c");
    compile(
        &clang,
        &multiarch,
        &manifest.join("bpf/flood.bpf.c"),
        &out.join("flood.bpf.o"),
    );
    // A program the verifier refuses, for the loader's tests.
    println!("cargo:rerun-if-changed=bpf/testdata/refused.bpf.c");
    compile(
        &clang,
        &multiarch,
        &manifest.join("bpf/testdata/refused.bpf.c"),
        &out.join("refused.bpf.o"),
    );
}

fn compile(clang: &str, multiarch: &str, src: &Path, obj: &Path) {
    let status = Command::new(clang)
        .args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf"])
        .arg(format!("-I{multiarch}"))
        .arg("-c")
        .arg(src)
        .arg("-o")
        .arg(obj)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{clang} failed on {} ({s})", src.display()),
        Err(e) => panic!(
            "cannot run {clang} to build the XDP program ({e}); install clang, \
             linux-libc-dev and libbpf-dev (./dev setup does)"
        ),
    }
}
