//! Command-line parsing of every command, and the commands that need no
//! node.

use clap::Parser;

use super::*;

const KEY48: &str = "a04ed6cd53d02e54d5d23d30239a65958c915deb5a508346c9e9cd923c86a8dea15966a635243ef1e59afb7d1dfbc380";
const ADDR: &str = "0x5fbdb2315678afecb367f032d93f642f64180aa3";

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("tally-evm").chain(args.iter().copied()))
}

fn err_text(args: &[&str]) -> String {
    parse(args).unwrap_err().to_string()
}

#[test]
fn every_command_parses() {
    let rpc = ["--rpc", "http://127.0.0.1:28800"];
    let pk = "ab".repeat(32);
    let cases: Vec<Vec<&str>> = vec![
        [
            &["deploy"][..],
            &rpc,
            &[
                "--key",
                "k",
                "--tally-chain-id",
                "tally-localnet",
                "--group-key",
                KEY48,
            ],
        ]
        .concat(),
        [
            &["deploy"][..],
            &rpc,
            &[
                "--key",
                "k",
                "--tally-chain-id",
                "t",
                "--group-key",
                KEY48,
                "--last-rotation",
                "3",
                "--wei-per-credit",
                "7",
                "--registration-fee",
                "2",
                "--governor",
                ADDR,
                "--governor",
                ADDR,
                "--governor-threshold",
                "2",
            ],
        ]
        .concat(),
        [
            &["deposit"][..],
            &rpc,
            &[
                "--key",
                "k",
                "--contract",
                ADDR,
                "--user",
                "alice",
                "--amount",
                "10",
            ],
        ]
        .concat(),
        [
            &["deposit"][..],
            &rpc,
            &[
                "--key",
                "k",
                "--contract",
                ADDR,
                "--user",
                "alice",
                "--amount",
                "10",
                "--pubkey",
                &pk,
            ],
        ]
        .concat(),
        [&["query"][..], &rpc, &["--contract", ADDR, "last-nonce"]].concat(),
        [
            &["query"][..],
            &rpc,
            &["--contract", ADDR, "--at", "finalized", "settled", "3"],
        ]
        .concat(),
        [
            &["query"][..],
            &rpc,
            &["--contract", ADDR, "--at", "12", "escrow", "alice"],
        ]
        .concat(),
        [
            &["query"][..],
            &rpc,
            &["--contract", ADDR, "payout", "acme"],
        ]
        .concat(),
        [
            &["query"][..],
            &rpc,
            &["--contract", ADDR, "withdrawn", "alice"],
        ]
        .concat(),
        [
            &["query"][..],
            &rpc,
            &["--contract", ADDR, "deposits", "1", "100"],
        ]
        .concat(),
        [&["query"][..], &rpc, &["--contract", ADDR, "group-key"]].concat(),
        [&["query"][..], &rpc, &["--contract", ADDR, "hub-name"]].concat(),
        [&["query"][..], &rpc, &["--contract", ADDR, "deposit-count"]].concat(),
        [&["query"][..], &rpc, &["--contract", ADDR, "last-rotation"]].concat(),
        [
            &["govern-key"][..],
            &rpc,
            &[
                "--key",
                "k",
                "--contract",
                ADDR,
                "--nonce",
                "2",
                "--epoch",
                "3",
                "--group-key",
                KEY48,
            ],
        ]
        .concat(),
        [
            &["withdraw"][..],
            &rpc,
            &["--key", "k", "--contract", ADDR, "--gas-limit", "100000"],
        ]
        .concat(),
        vec!["keygen", "--out", "f"],
        vec!["address", "--key", "f"],
    ];
    for c in cases {
        if let Err(e) = parse(&c) {
            panic!("{c:?}: {e}");
        }
    }
}

#[test]
fn bad_values_are_refused_with_what_is_wrong() {
    let rpc = ["--rpc", "http://127.0.0.1:28800"];
    let deploy = |gk: &str| -> String {
        err_text(
            &[
                &["deploy"][..],
                &rpc,
                &["--key", "k", "--tally-chain-id", "t", "--group-key", gk],
            ]
            .concat(),
        )
    };
    assert!(
        deploy("zz").contains("group key is not hex"),
        "{}",
        deploy("zz")
    );
    assert!(deploy(&KEY48[..94]).contains("group key has 47 bytes, want 48"));
    // 48 bytes, but the point at infinity.
    let inf = format!("c0{}", "00".repeat(47));
    assert!(
        deploy(&inf).contains("point at infinity"),
        "{}",
        deploy(&inf)
    );
    let e = err_text(
        &[
            &["query"][..],
            &rpc,
            &["--contract", "0x1234", "last-nonce"],
        ]
        .concat(),
    );
    assert!(e.contains("is not an address"), "{e}");
    let e = err_text(
        &[
            &["query"][..],
            &rpc,
            &["--contract", ADDR, "--at", "yesterday", "last-nonce"],
        ]
        .concat(),
    );
    assert!(e.contains("is not a block"), "{e}");
    let e = err_text(
        &[
            &["deposit"][..],
            &rpc,
            &[
                "--key",
                "k",
                "--contract",
                ADDR,
                "--user",
                "a",
                "--amount",
                "1",
                "--pubkey",
                "abcd",
            ],
        ]
        .concat(),
    );
    assert!(e.contains("pubkey has 2 bytes, want 32"), "{e}");
    let e = err_text(
        &[
            &["deposit"][..],
            &rpc,
            &[
                "--key",
                "k",
                "--contract",
                ADDR,
                "--user",
                "a",
                "--amount",
                "-1",
            ],
        ]
        .concat(),
    );
    assert!(e.contains("amount"), "{e}");
}

#[test]
fn keygen_writes_a_private_key_and_address_reads_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("relay.key");
    let f = f.to_str().unwrap();
    parse(&["keygen", "--out", f])
        .unwrap()
        .command
        .run()
        .unwrap();
    let mode = std::fs::metadata(f).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    parse(&["address", "--key", f])
        .unwrap()
        .command
        .run()
        .unwrap();
    let again = parse(&["keygen", "--out", f]).unwrap().command.run();
    assert!(format!("{:#}", again.unwrap_err()).contains("refusing to overwrite"));
    std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
    let open = parse(&["address", "--key", f]).unwrap().command.run();
    assert!(format!("{:#}", open.unwrap_err()).contains("too open"));
}

#[test]
fn hub_name_is_known_before_deploying() {
    // anvil's development account 0 deploys its first contract at
    // 0x5FbDB2315678afecb367f032d93F642f64180aa3 (a well-known address,
    // not derived here); the name is lowercase.
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("dev0.key");
    std::fs::write(
        &key,
        "ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80\n",
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let by_key = [
        "hub-name",
        "--chain-id",
        "31337",
        "--deployer-key",
        key.to_str().unwrap(),
        "--nonce",
        "0",
    ];
    let Command::HubName(a) = parse(&by_key).unwrap().command else {
        panic!("not hub-name");
    };
    assert_eq!(a.name().unwrap().to_string(), format!("evm:31337:{ADDR}"));
    let by_address = [
        "hub-name",
        "--chain-id",
        "31337",
        "--deployer",
        "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266",
        "--nonce",
        "1",
    ];
    let Command::HubName(b) = parse(&by_address).unwrap().command else {
        panic!("not hub-name");
    };
    // The same account's second contract (nonce 1), also well known.
    assert_eq!(
        b.name().unwrap().to_string(),
        "evm:31337:0xe7f1725e7734ce288f8367e1bb143e90bb3f0512"
    );
    assert!(err_text(&["hub-name", "--chain-id", "1", "--nonce", "0"]).contains("deployer"));
    assert!(err_text(&[
        "hub-name",
        "--chain-id",
        "1",
        "--deployer",
        ADDR,
        "--deployer-key",
        "k",
        "--nonce",
        "0"
    ])
    .contains("cannot be used with"));
}
