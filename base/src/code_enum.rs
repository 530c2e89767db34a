//! Enums whose variants stand for fixed integer codes (on a wire, in a
//! label): one declaration gives the enum, the list of its variants and
//! the look-up from a code, so that no list of variants is written twice.

/// Declares a fieldless enum whose every variant has an explicit code,
/// `#[repr]` of the code's type, with two items:
///
/// * `ALL`: every variant, in declaration order;
/// * `from_code(code)`: the variant whose code is `code`, `None` for a
///   code no variant has.
///
/// With a name after each variant (`Variant = code => "name"`) and a
/// method named after the variants (`fn name;`, with its docs and
/// visibility), that method returns the variant's name.
///
/// ```
/// granary_base::code_enum! {
///     /// A colour.
///     #[derive(Clone, Copy, Debug, PartialEq, Eq)]
///     pub enum Colour: u8 {
///         /// Red.
///         Red = 1 => "red",
///         /// Green.
///         Green = 2 => "green",
///     }
///     /// The colour's label.
///     pub fn label;
/// }
/// assert_eq!(Colour::ALL, [Colour::Red, Colour::Green]);
/// assert_eq!(Colour::from_code(2), Some(Colour::Green));
/// assert_eq!(Colour::from_code(3), None);
/// assert_eq!(Colour::Red.label(), "red");
/// ```
#[macro_export]
macro_rules! code_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident: $repr:ident {
            $($(#[$vmeta:meta])* $variant:ident = $code:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[repr($repr)]
        $vis enum $name {
            $($(#[$vmeta])* $variant = $code,)+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: [$name; [$(stringify!($variant)),+].len()] = [$($name::$variant),+];

            /// The variant whose code is `code`; `None` for a code no
            /// variant has.
            pub fn from_code(code: $repr) -> Option<$name> {
                $name::ALL.into_iter().find(|v| *v as $repr == code)
            }
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident: $repr:ident {
            $($(#[$vmeta:meta])* $variant:ident = $code:literal => $label:literal,)+
        }
        $(#[$fmeta:meta])*
        $fvis:vis fn $fname:ident;
    ) => {
        $crate::code_enum! {
            $(#[$meta])*
            $vis enum $name: $repr {
                $($(#[$vmeta])* $variant = $code,)+
            }
        }

        impl $name {
            $(#[$fmeta])*
            $fvis const fn $fname(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)+
                }
            }
        }
    };
}
