use super::*;
use std::collections::HashMap;

fn env_of(
    vars: &[(&str, String)],
) -> impl Fn(&str) -> std::result::Result<String, std::env::VarError> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    move |k| vars.get(k).cloned().ok_or(std::env::VarError::NotPresent)
}

fn bucket_of(url: &str) -> Result<(Bucket, String)> {
    let env = env_of(&[("AZURE_STORAGE_ACCOUNT", "acct".into())]);
    open(url, &env).map(|o| (o.bucket, o.prefix))
}

#[test]
fn each_scheme_names_its_bucket_or_container_and_prefix() {
    let b = |kind, name: &str| Bucket {
        kind,
        name: name.to_string(),
    };
    assert_eq!(
        bucket_of("s3://models/repo/v1").unwrap(),
        (b("bucket", "models"), "repo/v1".into())
    );
    assert_eq!(
        bucket_of("gs://models").unwrap(),
        (b("bucket", "models"), "".into())
    );
    assert_eq!(
        bucket_of("as://acct/models/repo").unwrap(),
        (b("container", "models"), "repo".into())
    );
    assert_eq!(
        bucket_of("az://models/repo").unwrap(),
        (b("container", "models"), "repo".into())
    );
}

#[test]
fn other_schemes_and_empty_names_are_refused_with_the_url() {
    let dir = tempfile::tempdir().unwrap();
    let e = RemoteRepo::new("ftp://b/m", dir.path()).err().unwrap();
    assert!(e.message().contains("'ftp://b/m'"), "{e}");
    for (url, what) in [
        ("s3:///m", "no bucket"),
        ("gs://", "no bucket"),
        ("as:///c/m", "no storage account"),
        ("as://acct", "no container"),
        ("az:///m", "no container"),
    ] {
        let e = bucket_of(url).err().unwrap();
        assert!(e.message().contains(what), "{url}: {e}");
        assert!(e.message().contains(url), "{url}: {e}");
    }
}

#[test]
fn ini_sections_are_read_as_the_aws_files_write_them() {
    let text = "# comment\n[default]\naws_access_key_id = AKIA1\nAWS_Secret_Access_Key=s1\n\
                [profile  ci]\nregion = eu-west-1\ns3 =\n  addressing_style = path\n\
                [ci]\naws_access_key_id = AKIA2\n; note\n";
    let d = ini_section(text, "default");
    assert_eq!(
        d.get("aws_access_key_id").map(String::as_str),
        Some("AKIA1")
    );
    assert_eq!(
        d.get("aws_secret_access_key").map(String::as_str),
        Some("s1")
    );
    assert_eq!(d.len(), 2);
    let p = ini_section(text, "profile ci");
    assert_eq!(p.get("region").map(String::as_str), Some("eu-west-1"));
    assert!(!p.contains_key("addressing_style"), "{p:?}");
    assert_eq!(ini_section(text, "ci").len(), 1);
    assert!(ini_section(text, "absent").is_empty());
}

#[test]
fn the_profile_takes_credentials_first_and_config_for_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let aws = dir.path().join(".aws");
    std::fs::create_dir(&aws).unwrap();
    std::fs::write(
        aws.join("credentials"),
        "[default]\naws_access_key_id=D\naws_secret_access_key=DS\n[ci]\naws_access_key_id=C\naws_secret_access_key=CS\n",
    )
    .unwrap();
    std::fs::write(
        aws.join("config"),
        "[default]\nregion=us-west-2\n[profile ci]\nregion=eu-west-1\naws_access_key_id=ignored\n",
    )
    .unwrap();
    let home = ("HOME", dir.path().display().to_string());
    let d = aws_profile(&env_of(std::slice::from_ref(&home)));
    assert_eq!(d.get("aws_access_key_id").map(String::as_str), Some("D"));
    assert_eq!(d.get("region").map(String::as_str), Some("us-west-2"));
    let c = aws_profile(&env_of(&[home.clone(), ("AWS_PROFILE", "ci".into())]));
    assert_eq!(c.get("aws_access_key_id").map(String::as_str), Some("C"));
    assert_eq!(c.get("region").map(String::as_str), Some("eu-west-1"));
    // Explicit file locations win over the home directory's.
    let other = dir.path().join("other");
    std::fs::write(&other, "[default]\naws_access_key_id=O\n").unwrap();
    let o = aws_profile(&env_of(&[
        home,
        ("AWS_SHARED_CREDENTIALS_FILE", other.display().to_string()),
    ]));
    assert_eq!(o.get("aws_access_key_id").map(String::as_str), Some("O"));
    assert!(aws_profile(&env_of(&[])).is_empty());
}
