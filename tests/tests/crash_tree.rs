//! SIGKILL at any point of a block's FinalizeBlock → Commit leaves a Merkle
//! tree that resumes to the same app hashes.
//!
//! The test re-runs its own binary as a child process that executes a
//! deterministic workload on a RocksDB store, height after height, the way
//! the app does: write the block's changes, compute the app hash
//! (FinalizeBlock's work), commit (one synced batch). The parent kills the
//! child with SIGKILL after a random delay, many times, so the kills land
//! while writes are buffered, while the tree is computed, and inside the
//! commit's write. After each kill it reopens the store and checks the last
//! committed height's app hash against a reference computed on the
//! in-memory twin, and that the tree at that height proves a key's value
//! (ICS23) under that hash. The next child resumes from the store. Pruning
//! is on (20 versions kept), so kills also land in pruning commits.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tally_store::{proof, Backend, Kv, MemBackend, Pending, RocksBackend};

const HEIGHTS: u64 = 300;
const RETAIN: u64 = 20;
const KILLS: usize = 30;
const CHILD_ENV: &str = "TALLY_CRASH_TREE_CHILD";

fn key(n: u64) -> Vec<u8> {
    format!("rr/k{:04}", n % 5000).into_bytes()
}

/// The writes of height `h`: every tenth height a range delete, 20
/// deletes, then 200 puts (a put after a delete of the same key wins).
fn workload(p: &mut Pending, h: u64) {
    if h.is_multiple_of(10) {
        p.delete_range(key(h * 11), key(h * 11 + 40));
    }
    for i in 0..20u64 {
        p.delete(key(h * 13 + i));
    }
    for i in 0..200u64 {
        p.put(key(h * 7919 + i * 31), format!("v{h}-{i}").into_bytes());
    }
}

fn run_heights(backend: Arc<dyn Backend>, to: u64) -> anyhow::Result<Vec<[u8; 32]>> {
    let mut p = Pending::open(backend)?;
    p.set_retain_versions(RETAIN);
    let mut roots = Vec::new();
    for h in p.committed().height + 1..=to {
        workload(&mut p, h);
        let root = p.app_hash_at(h)?;
        let meta = p.commit(h)?;
        anyhow::ensure!(meta.app_hash == root, "commit wrote another root at {h}");
        roots.push(root);
    }
    Ok(roots)
}

/// The child: resumes the workload on the store in `dir` up to HEIGHTS.
/// Not a test of its own: `spawn_child` runs it with `--ignored` in a
/// child process (so the totals count only the parent), and run any other
/// way, without the store's directory, it fails.
#[test]
#[ignore = "the child process of sigkill_anywhere_resumes_to_the_same_app_hashes"]
fn crash_tree_child() -> anyhow::Result<()> {
    let dir = std::env::var(CHILD_ENV).map_err(|_| {
        anyhow::anyhow!("{CHILD_ENV} is unset: this helper runs only as the crash test's child")
    })?;
    let backend: Arc<dyn Backend> = Arc::new(RocksBackend::open(Path::new(&dir))?);
    run_heights(backend, HEIGHTS)?;
    Ok(())
}

fn check_store(dir: &Path, roots: &[[u8; 32]]) -> anyhow::Result<u64> {
    let backend = RocksBackend::open(dir)?;
    let Some(meta) = backend.meta()? else {
        return Ok(0);
    };
    let h = meta.height;
    anyhow::ensure!((1..=HEIGHTS).contains(&h), "height {h} out of range");
    anyhow::ensure!(
        meta.app_hash == roots[h as usize - 1],
        "app hash at height {h} after the kill differs from the reference"
    );
    // The tree at `h` is whole: a key written at `h` proves its value.
    let k = key(h * 7919 + 199 * 31);
    let p = proof::prove(&backend, &k, h)?;
    anyhow::ensure!(
        p.root == meta.app_hash,
        "tree root at {h} is not the app hash"
    );
    let want = format!("v{h}-199").into_bytes();
    anyhow::ensure!(p.value.as_deref() == Some(want.as_slice()), "value at {h}");
    proof::verify(&meta.app_hash, &k, Some(&want), &p.proof)?;
    Ok(h)
}

fn spawn_child(dir: &Path) -> anyhow::Result<std::process::Child> {
    Ok(Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            "crash_tree_child",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_ENV, dir)
        .stdout(std::process::Stdio::null())
        .spawn()?)
}

#[test]
fn sigkill_anywhere_resumes_to_the_same_app_hashes() -> anyhow::Result<()> {
    let roots = run_heights(Arc::new(MemBackend::new()), HEIGHTS)?;
    let dir = tempfile::tempdir()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let mut heights = Vec::new();
    for _ in 0..KILLS {
        let mut child = spawn_child(dir.path())?;
        std::thread::sleep(Duration::from_millis(rng.gen_range(15..120)));
        // SIGKILL on Unix; an already finished child is fine.
        let _ = child.kill();
        child.wait()?;
        let h = check_store(dir.path(), &roots)?;
        heights.push(h);
        if h == HEIGHTS {
            break;
        }
    }
    println!("committed heights after each kill: {heights:?}");
    let distinct: std::collections::BTreeSet<_> = heights.iter().collect();
    anyhow::ensure!(
        distinct.len() >= 5,
        "the kills did not land at enough different heights: {heights:?}"
    );
    let status = spawn_child(dir.path())?.wait()?;
    anyhow::ensure!(status.success(), "the last child failed: {status}");
    anyhow::ensure!(check_store(dir.path(), &roots)? == HEIGHTS);
    // A kept older version still proves under its own root.
    let backend = RocksBackend::open(dir.path())?;
    let h = HEIGHTS - RETAIN + 1;
    let k = key(h * 7919 + 5 * 31);
    let p = proof::prove(&backend, &k, h)?;
    anyhow::ensure!(p.root == roots[h as usize - 1]);
    anyhow::ensure!(matches!(
        proof::prove(&backend, &k, h - 1),
        Err(proof::ProofError::Pruned { .. })
    ));
    Ok(())
}
