//! Synchronous calls that can wait without blocking their thread.
//!
//! rustls signs inside `Accepted::into_connection`, synchronously. With the
//! private keys in the key process, a signature is a round trip to it, and
//! a worker that blocks for it pays two context switches per signature and
//! serves nothing meanwhile. [`Suspendable`] runs such a call on a stack of
//! its own (a stackful coroutine, `corosensei`): a callback deep inside it
//! calls [`ask`], which suspends the call and hands the question to
//! whoever resumes it; the worker sends the signature request, goes on with
//! other connections (their requests join the same write), and resumes the
//! call with the answer. OpenSSL's `ASYNC_JOB` fibres do the same for its
//! engines.
//!
//! The coroutine only ever runs on the thread that made it: resuming it
//! elsewhere is refused and dropping it elsewhere leaks its stack. That is
//! what makes the handle `Send` (tokio's tasks must be) although the frames
//! on its stack may use thread-local state.

#![allow(unsafe_code)]

// A call dropped while suspended (a handshake that timed out waiting for
// its signature, a client gone) has its frames unwound on its own stack.
// Under `panic = "abort"` corosensei aborts there instead: every such
// timeout would take the worker down with all its connections.
#[cfg(panic = "abort")]
compile_error!("suspended calls are unwound when dropped: build with panic = \"unwind\"");

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::thread::{self, ThreadId};

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};

/// What a suspended call asks for.
pub type Question = Box<dyn Any + Send>;
/// What it is resumed with.
pub type Answer = Box<dyn Any + Send>;

/// Stack of one call: room for rustls' handshake and aws-lc's key
/// agreement (ML-KEM keeps its polynomials on the stack) with a wide
/// margin; only the pages touched become resident. Overflow hits a guard
/// page (a crash, not corruption).
const STACK_SIZE: usize = 256 * 1024;
/// Stacks kept for reuse per thread (mapping a fresh one costs an `mmap`,
/// page faults and a `munmap`).
const STACKS_KEPT: usize = 64;
/// Calls suspended at once per thread; beyond it, [`Suspendable::start`]
/// declines: the server's handshakes then run without one and refuse
/// to wait for a signature (`tlsgate_tls::run_signing`).
const MAX_SUSPENDED: usize = 1024;

thread_local! {
    /// The yielder of the call running on this thread right now, or null
    /// (no call, or the call is suspended).
    static CURRENT: Cell<*const Yielder<Answer, Question>> = const { Cell::new(std::ptr::null()) };
    static STACKS: RefCell<Vec<DefaultStack>> = const { RefCell::new(Vec::new()) };
    static LIVE: Cell<usize> = const { Cell::new(0) };
}

/// Asks whoever resumes the running [`Suspendable`] call for an answer,
/// suspending it until then. `Err` gives the question back when no such
/// call runs on this thread (the caller then answers it itself).
pub fn ask(question: Question) -> Result<Answer, Question> {
    let yielder = CURRENT.with(|c| c.replace(std::ptr::null()));
    if yielder.is_null() {
        return Err(question);
    }
    // SAFETY: `CURRENT` is set only by a call's body (see `start`) while it
    // runs on this thread, and cleared while it is suspended (here) or
    // finished (`Running`'s drop), so the yielder, which lives on that
    // call's stack, is alive. Nothing else reads it meanwhile: the null
    // left in `CURRENT` makes nested asks answer themselves.
    let answer = unsafe { &*yielder }.suspend(question);
    CURRENT.with(|c| c.set(yielder));
    Ok(answer)
}

/// Clears [`CURRENT`] when a call's body ends, by return or unwinding.
struct Running;

impl Drop for Running {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(std::ptr::null()));
    }
}

/// Where a resumed call stopped.
pub enum Step<R> {
    /// It asks this; resume it with the answer.
    Asked(Question),
    /// It returned.
    Done(R),
}

/// A call that may suspend itself through [`ask`].
pub struct Suspendable<R> {
    coroutine: Option<Coroutine<Answer, Question, R, DefaultStack>>,
    home: ThreadId,
}

// SAFETY: the coroutine runs only on `home`: `resume` refuses any other
// thread and `drop` leaks it there instead of unwinding it. Moving the
// handle between threads therefore moves no running code; the return
// value crosses only as `R`, which must be `Send`.
unsafe impl<R: Send> Send for Suspendable<R> {}

impl<R: 'static> Suspendable<R> {
    /// Prepares `call` to run on a stack of its own, or gives it back when
    /// this thread already holds [`MAX_SUSPENDED`] calls or no stack can
    /// be had.
    pub fn start<F: FnOnce() -> R + 'static>(call: F) -> Result<Self, F> {
        if LIVE.with(Cell::get) >= MAX_SUSPENDED {
            return Err(call);
        }
        let stack = match STACKS.with(|s| s.borrow_mut().pop()) {
            Some(s) => s,
            None => match DefaultStack::new(STACK_SIZE) {
                Ok(s) => s,
                Err(_) => return Err(call),
            },
        };
        LIVE.with(|l| l.set(l.get() + 1));
        // corosensei copies the closure onto the new stack and takes at
        // most 1 KiB; a ClientHello's state is more.
        let call = Box::new(call);
        let coroutine = Coroutine::with_stack(stack, move |yielder, _first: Answer| {
            let _running = Running;
            CURRENT.with(|c| c.set(yielder as *const _));
            call()
        });
        Ok(Self {
            coroutine: Some(coroutine),
            home: thread::current().id(),
        })
    }

    /// Runs the call until it asks or returns: first with `None`, then
    /// with the answer to what it asked. `None` back when this is not the
    /// thread that started it, or it has already returned.
    pub fn resume(&mut self, answer: Option<Answer>) -> Option<Step<R>> {
        if thread::current().id() != self.home {
            return None;
        }
        let coroutine = self.coroutine.as_mut().filter(|c| !c.done())?;
        let input: Answer = answer.unwrap_or_else(|| Box::new(()));
        Some(match coroutine.resume(input) {
            CoroutineResult::Yield(q) => Step::Asked(q),
            CoroutineResult::Return(r) => Step::Done(r),
        })
    }
}

impl<R> Drop for Suspendable<R> {
    fn drop(&mut self) {
        let Some(mut coroutine) = self.coroutine.take() else {
            return;
        };
        if thread::current().id() != self.home {
            // Its frames may not run here: keep them (and the stack) forever.
            std::mem::forget(coroutine);
            return;
        }
        LIVE.with(|l| l.set(l.get().saturating_sub(1)));
        if !coroutine.done() {
            // Dropped while suspended (a timeout, a closed connection), or
            // never run: unwind its frames so that what they hold is freed.
            coroutine.force_unwind();
        }
        let stack = coroutine.into_stack();
        STACKS.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < STACKS_KEPT {
                s.push(stack);
            }
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn start<R: 'static>(call: impl FnOnce() -> R + 'static) -> Suspendable<R> {
        Suspendable::start(call).ok().unwrap()
    }

    fn double_via_ask(x: u32) -> u32 {
        match ask(Box::new(x)) {
            Ok(a) => *a.downcast::<u32>().unwrap(),
            // Not suspendable here: answer it ourselves.
            Err(q) => *q.downcast::<u32>().unwrap() * 2,
        }
    }

    #[test]
    fn a_call_suspends_at_each_ask_and_returns_what_it_computed() {
        let mut call = start(|| double_via_ask(3) + double_via_ask(10));
        let mut answer = None;
        let mut asked = Vec::new();
        let result = loop {
            match call.resume(answer.take()).unwrap() {
                Step::Asked(q) => {
                    let x = *q.downcast::<u32>().unwrap();
                    asked.push(x);
                    answer = Some(Box::new(x * 100) as Answer);
                }
                Step::Done(r) => break r,
            }
        };
        assert_eq!(asked, [3, 10]);
        assert_eq!(result, 300 + 1000);
        assert!(call.resume(None).is_none(), "a finished call runs no more");
    }

    #[test]
    fn outside_a_call_ask_gives_the_question_back() {
        assert_eq!(double_via_ask(21), 42);
    }

    #[test]
    fn while_a_call_is_suspended_other_code_answers_itself() {
        let mut call = start(|| double_via_ask(1));
        assert!(matches!(call.resume(None), Some(Step::Asked(_))));
        // Suspended: code running on this thread now is not inside it.
        assert_eq!(double_via_ask(5), 10);
        match call.resume(Some(Box::new(7u32))) {
            Some(Step::Done(r)) => assert_eq!(r, 7),
            _ => panic!("the call should have returned"),
        }
    }

    #[test]
    fn a_call_dropped_while_suspended_frees_what_its_frames_hold() {
        let held = std::sync::Arc::new(());
        let inside = held.clone();
        let mut call = start(move || {
            let _keep = inside;
            double_via_ask(1)
        });
        assert!(matches!(call.resume(None), Some(Step::Asked(_))));
        assert_eq!(std::sync::Arc::strong_count(&held), 2);
        drop(call);
        assert_eq!(std::sync::Arc::strong_count(&held), 1, "unwound");
        assert_eq!(double_via_ask(4), 8, "and no call is current any more");
    }

    #[test]
    fn another_thread_can_neither_resume_nor_unwind_it() {
        let mut call = start(|| double_via_ask(1));
        assert!(matches!(call.resume(None), Some(Step::Asked(_))));
        let call = std::thread::spawn(move || {
            let mut call = call;
            assert!(call.resume(Some(Box::new(1u32))).is_none());
            call
        })
        .join()
        .unwrap();
        // Back home it goes on.
        let mut call = call;
        assert!(matches!(
            call.resume(Some(Box::new(9u32))),
            Some(Step::Done(9))
        ));
    }

    #[test]
    fn a_large_call_and_result_cross_over() {
        let big = [7u8; 4096];
        let mut call = start(move || {
            let _ = double_via_ask(1);
            big
        });
        assert!(matches!(call.resume(None), Some(Step::Asked(_))));
        match call.resume(Some(Box::new(2u32))) {
            Some(Step::Done(r)) => assert_eq!(r, [7u8; 4096]),
            _ => panic!("the call should have returned"),
        }
    }

    #[test]
    fn stacks_are_reused() {
        for _ in 0..3 {
            let mut call = start(|| 1);
            assert!(matches!(call.resume(None), Some(Step::Done(1))));
        }
        assert_eq!(STACKS.with(|s| s.borrow().len()), 1);
        assert_eq!(LIVE.with(Cell::get), 0);
    }
}
