//! Read buffers for the chunks of files sent over HTTP/2, reused within
//! a worker thread.
//!
//! A file goes out over h2 in chunks of whole frames (65,500 bytes by
//! default), each read into a buffer that h2 holds until it has written
//! the last frame cut from it. A fresh buffer per chunk takes jemalloc's
//! large-allocation path (above its thread cache's 32 KiB): an arena
//! lock, extent bookkeeping, pages given back to the kernel and faulted
//! in again, and a buffer the file's bytes are copied into cold. HTTP/1.1
//! reads every chunk of a response into the same buffer; here the last
//! frame's drop hands the buffer back to its worker's free list, and the
//! next chunk read on that worker takes it again while it is still in
//! cache. The list keeps at most [`MAX_FREE`] buffers a worker: an idle
//! worker holds at most 1 MiB of them at the default chunk size.
//!
//! The bytes a buffer held stay in it until a read overwrites them; what
//! the frames of a chunk expose is what its own read filled, no more.

use std::cell::RefCell;

use bytes::{Bytes, BytesMut};

use super::budget::Held;

/// Reads smaller than this get a buffer of their own size, as before:
/// jemalloc's thread cache serves them, and a 1 KiB body must not take a
/// 64 KiB buffer.
const REUSED_FROM: usize = 16 * 1024;

/// The most free buffers a worker keeps.
const MAX_FREE: usize = 16;

thread_local! {
    /// This worker thread's free buffers (connections never leave it).
    static FREE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer for a read of `n` bytes: a free one when there is one
/// large enough.
pub(super) fn buffer(n: usize) -> BytesMut {
    if n >= REUSED_FROM {
        let free = FREE.try_with(|f| f.borrow_mut().pop()).ok().flatten();
        if let Some(buf) = free.filter(|b| b.capacity() >= n) {
            return buf;
        }
    }
    BytesMut::with_capacity(n)
}

/// `buf` on the free list, emptied, unless it is small or the list full.
fn give_back(mut buf: BytesMut) {
    if buf.capacity() < REUSED_FROM {
        return;
    }
    buf.clear();
    // During the thread's exit the list may be gone: the buffer is freed.
    let _ = FREE.try_with(|f| {
        let mut f = f.borrow_mut();
        if f.len() < MAX_FREE {
            f.push(buf);
        }
    });
}

/// `buf`'s bytes as `Bytes` that keep `held` until the last frame cut
/// from them is dropped (h2 has written it), which hands `buf` back.
pub(super) fn frames_of(buf: BytesMut, held: Held) -> Bytes {
    super::budget::budgeted(Reused(buf), held)
}

/// A buffer given back when dropped.
struct Reused(BytesMut);

impl AsRef<[u8]> for Reused {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Reused {
    fn drop(&mut self) {
        give_back(std::mem::take(&mut self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_count() -> usize {
        FREE.with(|f| f.borrow().len())
    }

    #[test]
    fn a_large_buffer_comes_back_empty_once_its_last_frame_is_dropped() {
        let mut buf = buffer(65_500);
        buf.extend_from_slice(&[7u8; 65_500]);
        let at = buf.as_ptr();
        let before = free_count();
        let mut data = frames_of(buf, Held::none());
        let first = data.split_to(16_375);
        drop(data);
        assert_eq!(free_count(), before, "a frame still holds the buffer");
        assert_eq!(first.len(), 16_375);
        drop(first);
        assert_eq!(free_count(), before + 1);
        let again = buffer(65_500);
        assert_eq!(again.as_ptr(), at, "the same buffer, reused");
        assert!(again.is_empty(), "nothing of the last read is exposed");
    }

    #[test]
    fn small_reads_get_their_own_buffer_and_the_list_is_bounded() {
        let small = buffer(1024);
        assert!(small.capacity() < REUSED_FROM);
        give_back(small);
        let before = free_count();
        assert!(before <= MAX_FREE);
        for _ in 0..MAX_FREE + 4 {
            give_back(BytesMut::with_capacity(REUSED_FROM));
        }
        assert_eq!(free_count(), MAX_FREE);
    }

    #[test]
    fn a_free_buffer_too_small_for_the_read_is_not_used() {
        give_back(BytesMut::with_capacity(REUSED_FROM));
        let buf = buffer(4 * REUSED_FROM);
        assert!(buf.capacity() >= 4 * REUSED_FROM);
    }
}
