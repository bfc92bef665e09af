use super::*;

const SHARED: Scope = Scope(String::new());

/// A shm object of `size` bytes for one test, removed on drop.
struct Object(String);

impl Object {
    #[expect(unsafe_code, reason = "creating a test shm object")]
    fn new(tag: &str, size: usize) -> Object {
        let key = format!("/wisp-test-{tag}-{}", std::process::id());
        let c = std::ffi::CString::new(key.clone()).unwrap();
        // SAFETY: C calls on a fresh object we own.
        unsafe {
            let fd = libc::shm_open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT, 0o600);
            assert!(fd >= 0);
            assert_eq!(libc::ftruncate(fd, size as libc::off_t), 0);
            libc::close(fd);
        }
        Object(key)
    }
}

impl Drop for Object {
    #[expect(unsafe_code, reason = "removing a test shm object")]
    fn drop(&mut self) {
        let c = std::ffi::CString::new(self.0.clone()).unwrap();
        // SAFETY: unlinking the object this test created.
        unsafe { libc::shm_unlink(c.as_ptr()) };
    }
}

fn at(region: &str, offset: usize, byte_size: usize) -> ShmRef {
    ShmRef {
        region: region.into(),
        offset,
        byte_size,
    }
}

#[test]
fn a_region_round_trips_and_is_bounded() {
    let obj = Object::new("rt", 10_000);
    let shm = SharedMemory::default();
    // a window that starts off a page boundary
    shm.register(&SHARED, "r", &obj.0, 5000, 4000).unwrap();
    shm.write(&SHARED, &at("r", 10, 8), b"abcdefgh").unwrap();
    assert_eq!(&shm.read(&SHARED, &at("r", 12, 4)).unwrap()[..], b"cdef");
    // a second window over the same bytes sees the write
    shm.register(&SHARED, "r2", &obj.0, 5010, 8).unwrap();
    assert_eq!(
        &shm.read(&SHARED, &at("r2", 0, 8)).unwrap()[..],
        b"abcdefgh"
    );
    assert!(
        shm.read(&SHARED, &at("r", 3990, 11)).is_err(),
        "past the window"
    );
    assert!(
        shm.read(&SHARED, &at("r", usize::MAX, 2)).is_err(),
        "overflow"
    );
    assert!(
        shm.write(&SHARED, &at("r", 0, 2), b"abc").is_err(),
        "more than asked"
    );
    let e = shm.register(&SHARED, "r", &obj.0, 0, 1).unwrap_err();
    assert!(e.message().contains("already in manager"), "{e}");
    assert!(
        shm.register(&SHARED, "big", &obj.0, 9000, 1001).is_err(),
        "past the object"
    );
    assert_eq!(shm.status(&SHARED, None).unwrap().len(), 2);
    shm.unregister(&SHARED, Some("r"));
    assert!(shm.read(&SHARED, &at("r", 0, 1)).is_err());
    assert_eq!(
        shm.status(&SHARED, Some("r")).unwrap_err().kind(),
        wisp_core::ErrorKind::NotFound
    );
    shm.unregister(&SHARED, None);
    assert!(shm.status(&SHARED, None).unwrap().is_empty());
}

#[test]
fn a_region_unregistered_while_in_use_stays_mapped_for_its_user() {
    let obj = Object::new("use", 4096);
    let shm = SharedMemory::default();
    shm.register(&SHARED, "r", &obj.0, 0, 4096).unwrap();
    let held = shm.get(&SHARED, "r").unwrap();
    shm.unregister(&SHARED, Some("r"));
    held.map.write(0, b"still here").unwrap();
    assert_eq!(&held.map.read(0..10).unwrap()[..], b"still here");
}

/// The client owns the object and may shrink it under a registered region (a mapping
/// touched past the new end raised SIGBUS and killed the server): reads and writes are
/// refused with an error, and the region works again once the object has grown back.
#[test]
#[expect(unsafe_code, reason = "shrinking a test shm object")]
fn an_object_shrunk_under_its_region_is_an_error_not_a_crash() {
    let obj = Object::new("shrink", 1 << 20);
    let shm = SharedMemory::default();
    shm.register(&SHARED, "r", &obj.0, 4096, (1 << 20) - 4096)
        .unwrap();
    shm.write(&SHARED, &at("r", 0, 4), b"abcd").unwrap();
    let resize = |size: usize| {
        let c = std::ffi::CString::new(obj.0.clone()).unwrap();
        // SAFETY: C calls on the object this test created.
        unsafe {
            let fd = libc::shm_open(c.as_ptr(), libc::O_RDWR, 0);
            assert!(fd >= 0);
            assert_eq!(libc::ftruncate(fd, size as libc::off_t), 0);
            libc::close(fd);
        }
    };
    resize(0);
    let e = shm.read(&SHARED, &at("r", 0, 4)).unwrap_err();
    assert_eq!(e.kind(), wisp_core::ErrorKind::InvalidArg, "{e}");
    assert!(e.message().contains("region 'r'"), "{e}");
    assert!(e.message().contains("shrank to 0 bytes"), "{e}");
    let e = shm.write(&SHARED, &at("r", 100, 4), b"wxyz").unwrap_err();
    assert!(e.message().contains("shrank"), "{e}");
    // A partial shrink: the start still reads, the far end does not.
    resize(8192);
    assert_eq!(
        &shm.read(&SHARED, &at("r", 0, 4)).unwrap()[..],
        &[0, 0, 0, 0]
    );
    assert!(shm.read(&SHARED, &at("r", 8192, 4)).is_err());
    assert!(shm.write(&SHARED, &at("r", 4096, 1), b"x").is_err());
    resize(1 << 20);
    shm.write(&SHARED, &at("r", 500_000, 4), b"back").unwrap();
    assert_eq!(
        &shm.read(&SHARED, &at("r", 500_000, 4)).unwrap()[..],
        b"back"
    );
}

#[test]
fn keys_need_the_prefix_and_regions_fit_the_byte_cap() {
    let obj = Object::new("cap", 8192);
    let shm = SharedMemory::new("wisp-test-cap", 6000);
    shm.register(&SHARED, "a", &obj.0, 0, 4096).unwrap();
    let e = shm.register(&SHARED, "b", &obj.0, 0, 4096).unwrap_err();
    assert_eq!(e.kind(), wisp_core::ErrorKind::Exhausted, "{e}");
    assert!(e.message().contains("--shm-max-bytes"), "{e}");
    shm.register(&SHARED, "b", &obj.0, 4096, 1904).unwrap();
    shm.unregister(&SHARED, Some("a"));
    shm.register(&SHARED, "c", &obj.0, 0, 4096).unwrap();
    let other = SharedMemory::new("elsewhere", 1 << 20);
    let e = other.register(&SHARED, "r", &obj.0, 0, 1).unwrap_err();
    assert_eq!(e.kind(), wisp_core::ErrorKind::InvalidArg, "{e}");
    assert!(e.message().contains("--shm-key-prefix"), "{e}");
}

#[test]
fn keys_must_name_shm_objects() {
    let shm = SharedMemory::default();
    for key in ["", "/", "noslash", "/a/b", "/..", "/etc/passwd"] {
        assert!(shm.register(&SHARED, "r", key, 0, 1).is_err(), "{key}");
    }
    let e = shm
        .register(&SHARED, "r", "/wisp-no-such-object", 0, 1)
        .unwrap_err();
    assert!(
        e.message().contains("Unable to open shared memory region"),
        "{e}"
    );
}

#[test]
fn regions_belong_to_the_token_that_registered_them() {
    let obj = Object::new("scope", 8192);
    let shm = SharedMemory::default();
    let (alice, bob) = (
        Scope::from_token(Some(b"alice")).unwrap(),
        Scope::from_token(Some(b"bob")).unwrap(),
    );
    shm.register(&alice, "r", &obj.0, 0, 4096).unwrap();
    shm.write(&alice, &at("r", 0, 4), b"mine").unwrap();
    // Nobody else sees, reads, writes or unregisters it...
    for other in [&bob, &SHARED] {
        assert_eq!(
            shm.read(other, &at("r", 0, 4)).unwrap_err().kind(),
            wisp_core::ErrorKind::NotFound
        );
        assert!(shm.write(other, &at("r", 0, 4), b"evil").is_err());
        assert!(shm.status(other, None).unwrap().is_empty());
        shm.unregister(other, Some("r"));
        shm.unregister(other, None);
    }
    assert_eq!(&shm.read(&alice, &at("r", 0, 4)).unwrap()[..], b"mine");
    // ... the same name is free in another scope, but alice's key is not: registering it
    // answers exactly what a missing key answers.
    let other = Object::new("scope-other", 8192);
    shm.register(&bob, "r", &other.0, 4096, 4096).unwrap();
    for who in [&bob, &SHARED] {
        let taken = shm.register(who, "x", &obj.0, 0, 4).unwrap_err();
        let missing = format!("{}-gone", obj.0);
        let gone = shm.register(who, "x", &missing, 0, 4).unwrap_err();
        assert_eq!(taken.kind(), wisp_core::ErrorKind::NotFound, "{taken}");
        assert_eq!(
            taken.message().replace(&obj.0, "KEY"),
            gone.message().replace(&missing, "KEY")
        );
    }
    assert_eq!(shm.status(&alice, None).unwrap()[0].offset, 0);
    assert_eq!(shm.status(&bob, None).unwrap()[0].offset, 4096);
    shm.unregister(&alice, None);
    assert!(shm.status(&alice, None).unwrap().is_empty());
    assert_eq!(shm.status(&bob, None).unwrap().len(), 1);
    // Once alice's last region over it is gone, the key is free for anyone.
    shm.register(&bob, "x", &obj.0, 0, 4).unwrap();
    shm.unregister(&bob, None);

    for bad in [
        &b""[..],
        b"has space",
        &[b'a'; MAX_TOKEN_BYTES + 1],
        b"\xff",
    ] {
        assert!(Scope::from_token(Some(bad)).is_err(), "{bad:?}");
    }
    let strict = SharedMemory::default().requiring_token(true);
    let e = strict.register(&SHARED, "r", &obj.0, 0, 1).unwrap_err();
    assert_eq!(e.kind(), wisp_core::ErrorKind::Forbidden);
    assert!(e.message().contains(TOKEN_HEADER), "{e}");
    strict.register(&alice, "r", &obj.0, 0, 1).unwrap();
}

#[test]
fn quotas_are_per_scope_and_scopes_are_capped() {
    let obj = Object::new("quota", 1 << 20);
    let shm = SharedMemory::new("", 64 * 1024);
    let scope = |i: usize| Scope::from_token(Some(format!("t{i}").as_bytes())).unwrap();
    // One token takes its whole byte quota, and its region count: others are untouched.
    shm.register(&scope(0), "big", &obj.0, 0, 64 * 1024)
        .unwrap();
    let e = shm.register(&scope(0), "more", &obj.0, 0, 1).unwrap_err();
    assert_eq!(e.kind(), wisp_core::ErrorKind::Exhausted, "{e}");
    for i in 0..MAX_REGIONS_PER_SCOPE {
        shm.register(&scope(1), &format!("r{i}"), &obj.0, 0, 1)
            .unwrap_or_else(|e| {
                // scope 1 may not use scope 0's key: that is the refusal of a missing key
                assert_eq!(e.kind(), wisp_core::ErrorKind::NotFound, "{e}");
            });
    }
    shm.unregister(&scope(0), None);
    for i in 0..MAX_REGIONS_PER_SCOPE {
        shm.register(&scope(1), &format!("r{i}"), &obj.0, 0, 1)
            .unwrap();
    }
    let e = shm
        .register(&scope(1), "one-more", &obj.0, 0, 1)
        .unwrap_err();
    assert!(e.message().contains("under this token"), "{e}");
    // Other tokens still register, with their own keys, up to the cap on tokens.
    let objects: Vec<Object> = (2..MAX_SCOPES + 2)
        .map(|i| Object::new(&format!("quota{i}"), 4096))
        .collect();
    for (i, o) in (2..).zip(&objects) {
        let r = shm.register(&scope(i), "r", &o.0, 0, 4096);
        if i <= MAX_SCOPES {
            r.unwrap();
        } else {
            let e = r.unwrap_err();
            assert!(e.message().contains("tokens"), "{e}");
        }
    }
    assert_eq!(shm.status(&scope(2), None).unwrap().len(), 1);
}

#[test]
fn client_shared_memory_is_refused_unless_allowed() {
    let obj = Object::new("off", 4096);
    let off = SharedMemory::default().allowing_clients(false);
    let e = off.register(&SHARED, "r", &obj.0, 0, 4096).unwrap_err();
    assert_eq!(e.kind(), wisp_core::ErrorKind::Forbidden);
    assert!(e.message().contains("--allow-client-shm"), "{e}");
    assert!(off.status(&SHARED, None).unwrap().is_empty());
}
