//! Reading the files a job is made of (docket.toml, templates, schemas,
//! a keymap) with an error that says what the path is when it is not a file.

use std::path::Path;

/// A workspace file's text (docket.toml, a template, a schema, a keymap).
/// Only a regular file (or a link to one) is read: opening a FIFO waits for
/// a writer that may never come, and a device is not a file anyone meant.
pub fn read_text_file(path: &Path) -> std::io::Result<String> {
    use std::os::unix::fs::FileTypeExt;
    let kind = std::fs::metadata(path)?.file_type();
    let what = if kind.is_file() {
        return std::fs::read_to_string(path);
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else {
        "not a regular file"
    };
    Err(std::io::Error::other(format!(
        "is {what}, not a regular file"
    )))
}
