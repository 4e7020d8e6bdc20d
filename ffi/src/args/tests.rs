//! Unit tests of the argument decoding.

use super::*;

#[test]
fn byte_totals_overflow() {
    assert_eq!(total_bytes(3, 4, 5, "count").unwrap(), 60);
    assert_eq!(total_bytes(0, 8, 5, "count").unwrap(), 0);
    let e = total_bytes(usize::MAX / 2, 4, 2, "count").unwrap_err();
    assert!(e.message.contains("overflows"), "{}", e.message);
    assert!(total_bytes(isize::MAX as usize / 4 + 1, 4, 1, "c").is_err());
}

#[test]
fn null_buffers() {
    assert!(check_buffer(std::ptr::null(), 0, "sendbuff", 0).is_ok());
    let e = check_buffer(std::ptr::null(), 8, "sendbuff", 2).unwrap_err();
    assert_eq!(e.message, "sendbuff is NULL but count is 2");
}

#[test]
fn roots_and_tags() {
    assert_eq!(root_index(2, 3).unwrap(), 2);
    let e = root_index(3, 3).unwrap_err();
    assert_eq!(e.message, "root 3 is out of range for 3 ranks (0 .. 2)");
    assert!(root_index(-1, 3).is_err());
    assert_eq!(tag_value(HALO_MAX_TAG).unwrap(), HALO_MAX_TAG as u32);
    let e = tag_value(HALO_MAX_TAG + 1).unwrap_err();
    assert!(e.message.contains("out of range"), "{}", e.message);
    assert!(tag_value(-1).is_err());
}
