//! `brig-mkimage`: builds self-contained EROFS layer images for the container tier (the
//! built-in busybox and Debian bases, or a directory or tarball). Layers for the versioned
//! store are imported with `brig image import` instead.
//!
//! ```text
//! brig-mkimage busybox OUT.erofs
//! brig-mkimage debian OUT.erofs [--suite bookworm] [--include python3,git,...] [--user NAME]
//! brig-mkimage dir SRC_DIR OUT.erofs
//! brig-mkimage tar SRC.tar[.gz] OUT.erofs
//! ```
#![forbid(unsafe_code)]

use std::path::PathBuf;

use brig_images::build;
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "brig-mkimage", version, about = "Build EROFS layer images for Brig containers")]
struct Cli {
    /// Host uid that container root maps to (the node's id base).
    #[arg(long, default_value_t = 100_000)]
    id_base: u32,
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand, Debug)]
enum What {
    /// A tiny base: static busybox.
    Busybox { out: PathBuf },
    /// A Debian base by debootstrap.
    Debian {
        out: PathBuf,
        #[arg(long, default_value = "bookworm")]
        suite: String,
        #[arg(long, default_value = "http://deb.debian.org/debian")]
        mirror: String,
        #[arg(long, default_value = "bash,coreutils,python3,git,ca-certificates,procps")]
        include: String,
        /// An ordinary user to add (uid 1000, home /home/NAME, bash), e.g. E2B's `user`.
        #[arg(long)]
        user: Option<String>,
    },
    /// A layer from a directory tree.
    Dir { src: PathBuf, out: PathBuf },
    /// A layer from a tarball.
    Tar { src: PathBuf, out: PathBuf },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let out = match &cli.what {
        What::Busybox { out }
        | What::Debian { out, .. }
        | What::Dir { out, .. }
        | What::Tar { out, .. } => out,
    };
    let parent = out.parent().map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    let staging = build::Staging::new_in(&parent)?;
    let root = staging.path().join("root");
    std::fs::create_dir(&root)?;
    match &cli.what {
        What::Busybox { .. } => build::stage_busybox(&root)?,
        What::Debian { suite, mirror, include, user, .. } => {
            let packages: Vec<&str> = include.split(',').filter(|p| !p.is_empty()).collect();
            build::stage_debian(&root, suite, mirror, &packages)?;
            if let Some(user) = user {
                build::add_user(&root, user)?;
            }
        }
        What::Dir { src, .. } => build::stage_dir(src, &root)?,
        What::Tar { src, .. } => build::stage_tar(src, &root)?,
    }
    build::shift_ownership(&root, cli.id_base)?;
    build::mkfs_plain(&root, out)?;
    let size = std::fs::metadata(out)?.len();
    println!("{} ({} MiB)", out.display(), size >> 20);
    Ok(())
}
