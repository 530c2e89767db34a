//! Pinned `#[repr(C)]` layouts: the offsets of a type's fields checked at
//! compile time, written as a table.

/// Fails the build unless each listed field of each type lies at the
/// offset given: `Type { field: offset, ... }`, as many types as needed.
/// For the layouts shared with another process or a C caller, so that a
/// change cannot slip in unnoticed.
///
/// ```
/// #[repr(C)]
/// struct Pair {
///     a: u32,
///     b: u64,
/// }
/// granary_base::assert_offsets! {
///     Pair { a: 0, b: 8 }
/// }
/// ```
#[macro_export]
macro_rules! assert_offsets {
    ($($ty:ident { $($field:ident: $offset:expr),+ $(,)? })+) => {
        const _: () = {
            $($(assert!(::core::mem::offset_of!($ty, $field) == $offset);)+)+
        };
    };
}
