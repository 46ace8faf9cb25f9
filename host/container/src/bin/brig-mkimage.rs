//! `brig-mkimage`: builds read-only layer images (EROFS) for the container tier.
//!
//! ```text
//! brig-mkimage busybox OUT.erofs
//! brig-mkimage debian OUT.erofs [--suite bookworm] [--include python3,git,...]
//! brig-mkimage dir SRC_DIR OUT.erofs
//! brig-mkimage tar SRC.tar[.gz] OUT.erofs
//! ```

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "brig-mkimage", version, about = "Build EROFS layer images for Brig containers")]
struct Cli {
    /// Host uid that container root maps to (the node's id base).
    #[arg(long, default_value_t = brig_container::runtime::DEFAULT_ID_BASE)]
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
    },
    /// A layer from a directory tree.
    Dir { src: PathBuf, out: PathBuf },
    /// A layer from a tarball.
    Tar { src: PathBuf, out: PathBuf },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    use brig_container::image;
    let out = match &cli.what {
        What::Busybox { out } => {
            image::busybox(out, cli.id_base)?;
            out
        }
        What::Debian { out, suite, mirror, include } => {
            let packages: Vec<&str> = include.split(',').filter(|p| !p.is_empty()).collect();
            image::debian(out, cli.id_base, suite, mirror, &packages)?;
            out
        }
        What::Dir { src, out } => {
            image::from_dir(src, out, cli.id_base)?;
            out
        }
        What::Tar { src, out } => {
            image::from_tar(src, out, cli.id_base)?;
            out
        }
    };
    let size = std::fs::metadata(out)?.len();
    println!("{} ({} MiB)", out.display(), size >> 20);
    Ok(())
}
